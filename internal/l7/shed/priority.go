// Package shed bounds how much work the L7 stage lets through at once:
// per-route or per-key concurrency limits, a bounded priority wait queue with
// a timeout, probabilistic shedding when that queue is deep, an adaptive
// (AIMD) concurrency limit, and the HTTP middleware and Prometheus metrics
// that expose them. docs/l7-shedding.md describes the semantics and defaults.
package shed

import "errors"

// Priority orders requests when capacity is short. The zero value is
// PriorityDefault.
//
// Critical requests may use a reserved share of the limit that the other
// priorities cannot, are served first from the queue, see only critical
// requests ahead of them when the shedding lottery measures queue depth, and
// may push a lower-priority request out of a full queue. Sheddable requests
// are the opposite on every count: they go first.
type Priority uint8

const (
	PriorityDefault Priority = iota
	PriorityCritical
	PrioritySheddable

	numPriorities = 3
)

// String returns the label value used in metrics.
func (p Priority) String() string {
	switch p {
	case PriorityDefault:
		return "default"
	case PriorityCritical:
		return "critical"
	case PrioritySheddable:
		return "sheddable"
	}
	return "invalid"
}

// rank is the queue service order: 0 is served first.
func (p Priority) rank() int {
	switch p {
	case PriorityCritical:
		return 0
	case PriorityDefault:
		return 1
	}
	return 2
}

// Reason says why a request was shed. It is a metric label value.
type Reason uint8

const (
	// ReasonAtLimit: no free slot and no queue configured.
	ReasonAtLimit Reason = iota
	// ReasonQueueFull: the queue was at its hard limit and held nothing of
	// lower priority to push out.
	ReasonQueueFull
	// ReasonQueueShed: lost the lottery for a place in a deep queue.
	ReasonQueueShed
	// ReasonQueueTimeout: waited QueueTimeout without getting a slot.
	ReasonQueueTimeout
	// ReasonEvicted: pushed out of a full queue by a higher-priority request.
	ReasonEvicted
	// ReasonCanceled: the request's context ended while it was queued.
	ReasonCanceled

	numReasons = 6
)

// String returns the label value used in metrics.
func (r Reason) String() string {
	switch r {
	case ReasonAtLimit:
		return "at_limit"
	case ReasonQueueFull:
		return "queue_full"
	case ReasonQueueShed:
		return "queue_shed"
	case ReasonQueueTimeout:
		return "queue_timeout"
	case ReasonEvicted:
		return "evicted"
	case ReasonCanceled:
		return "canceled"
	}
	return "invalid"
}

// ErrShed matches (errors.Is) every error Acquire returns for a request that
// was not admitted.
var ErrShed = errors.New("request shed")

// ShedError is the error Acquire returns when it sheds a request, except for
// ReasonCanceled, which comes wrapped with the context's error. It is an
// integer so that returning it does not allocate.
type ShedError Reason

// Reason returns why the request was shed.
func (e ShedError) Reason() Reason { return Reason(e) }

func (e ShedError) Error() string { return "request shed: " + Reason(e).String() }

// Is makes errors.Is(err, ErrShed) true.
func (e ShedError) Is(target error) bool { return target == ErrShed }

// ReasonOf returns the shed reason carried by err, if any.
func ReasonOf(err error) (Reason, bool) {
	var se ShedError
	if errors.As(err, &se) {
		return Reason(se), true
	}
	var ce *canceledError
	if errors.As(err, &ce) {
		return ReasonCanceled, true
	}
	return 0, false
}

// canceledError reports a request whose context ended while it was queued.
// It matches both ErrShed and the context's error.
type canceledError struct{ cause error }

func (e *canceledError) Error() string { return "request shed: left the queue: " + e.cause.Error() }

func (e *canceledError) Unwrap() []error { return []error{ErrShed, e.cause} }
