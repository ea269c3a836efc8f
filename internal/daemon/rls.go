package daemon

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/l7/rls"
)

// `edgectl l7 explain --domain D --descriptor k=v,k=v`: what the
// rate-limit service would answer now, charging nothing (docs/l7-rls.md).

func (d *Daemon) rlsRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/l7/rls/explain", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		req := rls.Request{Domain: q.Get("domain")}
		for _, s := range q["descriptor"] {
			var desc rls.Descriptor
			for _, part := range strings.Split(s, ",") {
				k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
				if !ok {
					writeError(w, http.StatusBadRequest, fmt.Errorf("descriptor %q: want key=value,key=value", s))
					return
				}
				desc.Entries = append(desc.Entries, rls.Entry{Key: k, Value: v})
			}
			req.Descriptors = append(req.Descriptors, desc)
		}
		svc := d.l7.rls.Service()
		if svc == nil {
			writeError(w, http.StatusNotFound, errors.New("the rate-limit service is off (no l7 rls: section)"))
			return
		}
		v, err := svc.Explain(&req)
		if err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		writeJSON(w, rlsExplanation(&req, &v))
	})
}

func rlsExplanation(req *rls.Request, v *rls.Verdict) control.RLSExplanation {
	// Explain takes 0 units: a limit admits the next request when one
	// unit remains.
	e := control.RLSExplanation{Domain: req.Domain, Allowed: true}
	outside := false
	if v.Ranked {
		e.Class, e.Client = v.Class.String(), v.Client.String()
		outside = !v.Class.Priority()
	}
	for i, st := range v.Statuses {
		var parts []string
		for _, en := range req.Descriptors[i].Entries {
			parts = append(parts, en.Key+"="+en.Value)
		}
		de := control.RLSDescriptorExplain{Entries: strings.Join(parts, ", "), Rule: st.Rule, Tier: st.Tier, Key: st.Key}
		for _, l := range st.Limits {
			le := control.RLSLimitExplain{Name: l.Name, Rate: fmt.Sprintf("%d/%s", l.Count, l.Per), Backend: l.Backend,
				Shadow: l.Shadow, Read: l.Decision.Limit > 0, Remaining: l.Decision.Remaining,
				Reserve: l.Reserve, Reset: control.Duration(l.Decision.Reset)}
			need := int64(1)
			if outside {
				need += l.Reserve // the reserve is the first class's
			}
			le.Allowed = !le.Read || le.Remaining >= need
			if le.Read && !le.Shadow && !le.Allowed {
				e.Allowed = false
			}
			de.Limits = append(de.Limits, le)
		}
		e.Descriptors = append(e.Descriptors, de)
	}
	return e
}
