// Package daemon runs Edgeguard on a host: it loads (or takes over) the data
// plane, attaches it to interfaces, applies the policy atomically, reloads
// it on SIGHUP and on file change, serves the control socket and metrics,
// and reports counters until its context ends.
//
// # One policy change
//
// A change (start, SIGHUP, the file watcher, 'edgectl policy apply') runs
// under changeMu: prepare (parse, compile, ASN data, L7 decode; no map
// touched), apply (interfaces checked, the L7 stage prepared, the
// generation staged into the inactive half, then committed under mu: the
// flip, the lists, status), then publish: the committed generation is
// handed to each subscriber in the one order subscribers() states (syn, l7,
// standing, capture, sampler, counters, shield, fleet, bgp). Nothing polls
// for a new policy.
//
// # Owners
//
// Each subsystem is a type that owns its state, its goroutines and the
// maps store it writes, and is given what it needs at its making:
// synStage (the SYN path, maps.Syn), runLists (the run-time list entries,
// maps.ListStore), standingWatch (congestion, the standing sweep, L7
// promotion; maps.StandingStore), captureHub (capture streams),
// sampleRings (both sample rings, maps.SampleStore), counterWatch (the
// counter readings), l7Run (the L7 stage and the rate-limit service),
// shieldRun (maps.OverrideStore, maps.FingerprintStore), fleetLink,
// bgpRun. *Daemon is the wiring, the apply path (maps.Generations, the
// attachments) and the control API.
//
// # Goroutines (serve starts them; each ends with serve's context)
//
//   - control socket (serveControl): one goroutine per request besides;
//     policy changes take changeMu, reads take mu briefly. Its shutdown
//     goroutine waits for a change in progress (waitForChange).
//     A capture stream (captureHub.serve) is one such request: it names
//     frames by the generation captureHub last followed (captureHub.genMu)
//     and the live rule slots, and ends when the hub closes at stop.
//   - metrics (serveMetrics): scrapes read the maps and take mu briefly.
//   - policy watch (watchPolicy): SIGHUP and the policy file's content;
//     reloads under changeMu, so it runs the subscribers too.
//   - samples (sampleRings.readDrops): the drop-sample ring; feeds top,
//     recent (explain), the congestion watch and capture
//     (captureHub.publish).
//   - shield samples (sampleRings.readRates): the 1-in-N ring into
//     shieldRun.in, and capture. sampleRings owns both readers and the
//     sampler's counters; it reports the sampler settings of the
//     generation it last followed (sampleRings.mu).
//   - counters (counterWatch.run): history (rates for stats, the offered
//     rate for BGP), the counter lines on Out; reads the rules of the
//     generation counterWatch last followed (counterWatch.mu).
//   - list expiry (runLists.expire), escalations
//     (l7Run.applyEscalations, through AddToList): run-time list entries,
//     under mu. runLists owns them, their file in the state directory and
//     the data plane's lists; they change only with the policy they merge
//     with, so mu guards them.
//   - log reopen (l7Run.reopenLogs): the L7 access log on SIGUSR1; its
//     outcome under l7Run.mu.
//   - mptcp watch (synStage.watchMPTCP): re-applies the SYN services of
//     the generation synStage last followed when a listener changes
//     between TCP and MPTCP, under mu (synStage borrows the daemon's
//     attachments under it).
//   - link watch (watchLinks: re-attaches re-created interfaces, under mu).
//   - standing (standingWatch.run): the congestion state and the standing
//     table's sweep, by the generation standingWatch last followed (its
//     rule names and standing settings, under standingWatch.mu); writes
//     the standing table (maps.StandingStore).
//   - shield (shieldRun.run): owns the engine's interval: Observe, Tick and
//     the writes of its changes (under shieldRun.turn), baselines saved.
//   - fleet (fleetLink.run): owns the running fleet's lifetime (stops it at the
//     end); the fleet itself runs in its own goroutine (fleet.Run), started
//     and stopped by fleetLink.follow.
//   - bgp (bgpRun.run): expiry, the automatic blackhole, saving, the password
//     files (under bgpRun.turn); closes the speaker at the end.
//
// The L7 stage and the rate-limit service run their own goroutines
// (internal/l7/stage, internal/l7/rls); l7Run prepares them on the apply
// path, makes them live when the generation is pushed, and closes them at
// stop. Their L7 promotions write the standing table through
// standingWatch.Promote, their class ranking reads it (classStandings).
//
// # Locks, and what each guards
//
//   - changeMu: one policy change at a time, and fileRaw, applied,
//     stopping, the ASN cache. Held across prepare, stage, commit and
//     publish; never taken by a goroutine that holds another lock.
//   - shieldRun.turn, bgpRun.turn: the subsystem's configuration against
//     its own loop (shieldRun.follow vs shieldRun.tick; bgpRun.follow vs
//     the password check), so a reconfiguration and a loop's writes never
//     interleave.
//   - mu: the running policy (cur, generation, origin, lastReload,
//     counts), the run-time list entries (runLists), the attachments
//     (atts), the SYN path's loading and the section it last followed.
//     Held only to read them or to commit a prepared change (the flip, the
//     lists, the SYN services): never across a slow step (a generation is
//     staged without it; Explain and the frame replay copy their view
//     under it and read the maps after).
//   - fleetLink.mu: the running fleet, its section, its error.
//   - synStage.mu: the SYN services' names and modes (metrics, stats).
//   - shieldRun.mu: the engine pointer, its section, generation, rule
//     slots and ASN table; bgpRun.mu: the section wanted and running, the
//     speaker, its passwords, error and asked fingerprints.
//   - leaves, taken last and alone: history, topTalkers, recentSamples,
//     standingWatch.mu, captureHub.mu and captureHub.genMu,
//     sampleRings.mu, counterWatch.mu, l7Run.mu, the audit files' locks.
//
// Lock order: changeMu → (shieldRun.turn | bgpRun.turn) → mu →
// (fleetLink.mu | synStage.mu) → leaves. shieldRun.mu and bgpRun.mu are
// held only to copy or set their fields, with no other lock taken inside
// (a BGP speaker adopting the shield's actions takes them one after the
// other). The engine (shield.Engine), the speaker (bgp.Speaker) and the
// fleet (fleet.Fleet) have locks of their own, below all of these.
package daemon
