//go:build unix

package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/lockerhq/locker/internal/bench"
)

// dur formats a latency with three significant digits.
func dur(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", d.Nanoseconds())
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/1e3)
	case d < time.Second:
		return fmt.Sprintf("%.3gms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.3gs", d.Seconds())
	}
}

func rate(r float64) string {
	switch {
	case r >= 1e5:
		return fmt.Sprintf("%.0fk", r/1e3)
	case r >= 1e4:
		return fmt.Sprintf("%.1fk", r/1e3)
	default:
		return fmt.Sprintf("%.0f", r)
	}
}

// ran reports whether the run included workload w.
func (rep benchReport) ran(w string) bool { return slices.Contains(rep.Config.Workloads, w) }

// missing is what a cell shows for a workload without a result.
func (rep benchReport) missing(w string) string {
	if rep.ran(w) {
		return "error"
	}
	return "-"
}

// ratio formats a spread of per-round ratios: median [min–max].
func ratio(s bench.Spread) string {
	if s.Rounds == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f [%.2f–%.2f]", s.Median, s.Min, s.Max)
}

func pct(x float64) string { return fmt.Sprintf("%.0f%%", 100*x) }

// writeTable prints the results as one Markdown table.
func writeTable(w io.Writer, rep benchReport) {
	c := rep.Config
	fmt.Fprintf(w, "lockctl bench, %s, %s/%s, %d CPUs, %s, %v per timed workload, TTL %v; took %v\n",
		rep.Date.Format("2006-01-02 15:04 MST"), rep.Machine.OS, rep.Machine.Arch, rep.Machine.CPUs, rep.Machine.Go,
		c.Duration, c.TTL, rep.Took.Round(time.Second))
	fmt.Fprintf(w, "acquire+release: on a new name each, p50 and p99 over the rounds; ×floor: its p50 over the raw floor's (bare store requests on the same connections),\n"+
		"interleaved in blocks of 50, median [range] over the rounds (— without a raw floor); parallel: goroutines of one client on names of their own,\n"+
		"cycles/s and this process's CPU per cycle, each over the raw floor's run by the same goroutines, in alternating rounds; handoff: from a Release call to the next holder's Acquire returning;\n"+
		"round trip: a refused TryAcquire, during the run; wait: Acquire call to return; retake: handoffs to the worker that released\n\n")
	fmt.Fprintf(w, "| backend | acquire+release p50 | p99 | ops/s | ×floor | %d parallel: cycles/s | ×floor | CPU/cycle | ×floor | p99 | %d workers on %d clients: acq/s | handoff p50 | p99 | round trip | handoff/rtt | wait p99 | fairness max/min | retake | %d held: heap/lock | refreshes/s | refresh calls/s | goroutines |\n",
		c.Parallel, c.Workers, c.Clients, c.Held)
	fmt.Fprintln(w, "|---"+strings.Repeat("|--:", 21)+"|")
	for _, r := range rep.Results {
		cells := []string{r.Backend}
		if l := r.Uncontended; l != nil {
			vs := "—"
			if a := r.Floor.Subject(bench.SubjectAcquire); a != nil {
				vs = ratio(a.VsFloor)
			}
			cells = append(cells, dur(l.P50), dur(l.P99), rate(l.OpsPerSec), vs)
		} else {
			cells = append(cells, rep.missing("uncontended"), "", "", "")
		}
		if p := r.Parallel; p != nil {
			cells = append(cells, rate(p.Lock.PerSec.Median), ratio(p.VsFloor), dur(p.Lock.CPU), ratio(p.CPUVsFloor), dur(p.Lock.P99))
		} else {
			cells = append(cells, rep.missing("parallel"), "", "", "", "")
		}
		if k := r.Contended; k != nil {
			fair := "∞"
			if k.MinPer > 0 {
				fair = fmt.Sprintf("%.2f", k.Fairness)
			}
			perRTT := "-"
			if k.HandoffPerRoundTrip > 0 {
				perRTT = fmt.Sprintf("%.1f", k.HandoffPerRoundTrip)
			}
			cells = append(cells, rate(k.AcquisitionsSec), dur(k.HandoffP50), dur(k.HandoffP99), dur(k.RoundTrip), perRTT,
				dur(k.WaitP99), fair, fmt.Sprintf("%.0f%%", 100*k.Retake))
		} else {
			cells = append(cells, rep.missing("contended"), "", "", "", "", "", "", "")
		}
		if h := r.Held; h != nil {
			held := fmt.Sprintf("%.0f B", h.BytesPerLock)
			if h.Errors > 0 || h.Lost > 0 {
				held += fmt.Sprintf(" (%d not acquired, %d lost)", h.Errors, h.Lost)
			}
			refreshes, calls := rate(h.RefreshesSec), rate(h.CallsSec)
			if h.Session {
				refreshes, calls = "session", "session"
			} else if h.Batch {
				calls += " (batched"
				if h.CallsSec > 0 {
					calls += fmt.Sprintf(", %.0f locks/call", h.RefreshesSec/h.CallsSec)
				}
				calls += ")"
			}
			cells = append(cells, held, refreshes, calls, fmt.Sprintf("%+d", h.Goroutines))
		} else {
			cells = append(cells, rep.missing("held"), "", "", "")
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
}

// floorSubjects are the columns of the floor table, after the floor.
var floorSubjects = []string{bench.SubjectDriver, bench.SubjectAcquire, bench.SubjectTry, bench.SubjectTryKept, bench.SubjectNoAuto}

// inProcess is a bare driver cycle's fast time (twice) under which the
// store answers without a network round trip (mem).
const inProcess = 10 * time.Microsecond

// writeFloorTable prints the uncontended comparison: each way of taking a
// free lock against the raw floor, and the share of its operations in the
// slow loopback mode.
func writeFloorTable(w io.Writer, rep benchReport) {
	if !rep.ran("uncontended") {
		return
	}
	fmt.Fprintf(w, "\nuncontended, interleaved on one client in blocks of 50 ops over rounds: p50 over the raw floor's, median [range] over rounds\n"+
		"(without a raw floor, —, each subject's p50);\n"+
		"driver: Driver.TryAcquire+Release; acquire: Client.Acquire+Release; try: Client.TryAcquire+Release; try-kept: try while another lock is held\n"+
		"(the watchdog's goroutine is not woken); try-noauto: try with AutoRefresh(false); slow: share of ops over their own 5th percentile plus\n"+
		"the driver's (twice the floor's for the floor): ops with a round trip in the slow mode; in brackets, the share minus the driver's, paired\n"+
		"per round, median (points): above 0, the Client's path meets the slow mode more often than its bare requests\n\n")
	fmt.Fprintf(w, "| backend | floor p50 | %s | slow: floor | %s |\n", strings.Join(floorSubjects, " | "), strings.Join(floorSubjects, " | "))
	fmt.Fprintln(w, "|---"+strings.Repeat("|--:", 2+2*len(floorSubjects))+"|")
	for _, r := range rep.Results {
		cells := []string{r.Backend}
		f := r.Floor
		if f == nil {
			cells = append(cells, rep.missing("uncontended"))
			fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
			continue
		}
		fl := f.Subject(bench.SubjectFloor)
		if fl != nil {
			cells = append(cells, dur(fl.P50))
		} else {
			cells = append(cells, "—")
		}
		for _, name := range floorSubjects {
			s := f.Subject(name)
			switch {
			case s == nil:
				cells = append(cells, "")
			case fl == nil: // no floor: the subject's own p50
				cells = append(cells, dur(s.P50))
			default:
				cells = append(cells, ratio(s.VsFloor))
			}
		}
		// A store in the process has no round trip to be slow.
		if d := f.Subject(bench.SubjectDriver); d != nil && d.SlowAbove < inProcess {
			cells = append(cells, "no network")
			cells = append(cells, make([]string, len(floorSubjects))...)
			fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
			continue
		}
		if fl != nil {
			cells = append(cells, pct(fl.Slow))
		} else {
			cells = append(cells, "—")
		}
		for _, name := range floorSubjects {
			if s := f.Subject(name); s != nil {
				cell := pct(s.Slow)
				if name != bench.SubjectDriver && s.SlowOverDriver.Rounds > 0 {
					cell += fmt.Sprintf(" (%+.1f)", 100*s.SlowOverDriver.Median)
				}
				cells = append(cells, cell)
			} else {
				cells = append(cells, "")
			}
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
}

// writeScaleTable prints the scale workloads.
func writeScaleTable(w io.Writer, rep benchReport) {
	if !rep.ran("scale") && !rep.ran("names") {
		return
	}
	c := rep.Config
	fmt.Fprintf(w, "\nscale: workers on one name, first %d then %d, over %d clients; names: %d names × %d workers over %d clients;\n"+
		"CPU/acq: the process's user+system CPU over acquisitions (the client side, unless the store runs in the process);\n"+
		"tries/acq: requests that could grant a waiting acquisition, per acquisition, flat as waiters grow when a release wakes O(1) waiters (no herd):\n"+
		"  \"store\", counted inside the driver where its queue's looks and hand-offs are not TryAcquire calls (wake-ups' and first tries included), or\n"+
		"  \"client\", the Client's driver TryAcquire calls; \"queue\": a queued driver that counts none\n\n",
		c.ScaleClients, c.ScaleWorkers, c.ScaleClients, c.Names, c.NameWorkers, c.NameClients)
	head := func(s string) string { return s + ": acq/s | wait p99 | CPU/acq | tries/acq" }
	fmt.Fprintf(w, "| backend | %s | %s | fairness | retake | %s |\n",
		head(fmt.Sprintf("%d workers", c.ScaleClients)), head(fmt.Sprintf("%d workers", c.ScaleWorkers)), head(fmt.Sprintf("%d names", c.Names)))
	fmt.Fprintln(w, "|---"+strings.Repeat("|--:", 14)+"|")
	cols := func(k *bench.Scale, w string) []string {
		if k == nil {
			return []string{rep.missing(w), "", "", ""}
		}
		tries := triesCell(k)
		return []string{rate(k.AcquisitionsSec), dur(k.WaitP99), dur(k.CPUPerAcq), tries}
	}
	for _, r := range rep.Results {
		cells := []string{r.Backend}
		cells = append(cells, cols(r.ScaleFew, "scale")...)
		cells = append(cells, cols(r.Scale, "scale")...)
		if k := r.Scale; k != nil {
			fair := "∞"
			if k.Fairness > 0 {
				fair = fmt.Sprintf("%.2f", k.Fairness)
			}
			cells = append(cells, fair, pct(k.Retake))
		} else {
			cells = append(cells, "", "")
		}
		cells = append(cells, cols(r.Names, "names")...)
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
}

// triesCell is a scale run's tries per acquisition and their source.
func triesCell(k *bench.Scale) string {
	if k.TriesFrom == bench.TriesNone {
		return "queue"
	}
	return fmt.Sprintf("%.2f %s", k.Tries, k.TriesFrom)
}

// writeSetTable prints the lock-set workload.
func writeSetTable(w io.Writer, rep benchReport) {
	if !rep.ran("set") {
		return
	}
	fmt.Fprintln(w, "\nlock sets: TryAcquireAll+Release of 4 names against TryAcquire+Release of one, interleaved on one client; ×one: the set's time over one name's, per round;")
	fmt.Fprintln(w, "crossed: 6 goroutines on 2 clients, AcquireAll+Release of two names of a ring of three in crossed orders ({a, b}, {b, a}, ...): sets/s, acquire+release p99, sets not taken in 10s")
	fmt.Fprintln(w, "\n| backend | one name p50 | 4 names p50 | ×one | crossed: sets/s | p99 | not taken |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|")
	for _, r := range rep.Results {
		if s := r.LockSet; s != nil {
			fmt.Fprintf(w, "| %s | %s | %s | %s | %.0f | %s | %d |\n", r.Backend, dur(s.One.P50), dur(s.Set.P50), ratio(s.Ratio), s.Crossed.PerSec.Median, dur(s.Crossed.P99), s.Crossed.Errors)
		} else {
			fmt.Fprintf(w, "| %s | %s | | | | | |\n", r.Backend, rep.missing("set"))
		}
	}
}

// writeSemaphoreTable prints the semaphore workload as a second table.
func writeSemaphoreTable(w io.Writer, rep benchReport) {
	if !rep.ran("semaphore") {
		return
	}
	c := rep.Config
	fmt.Fprintf(w, "\nsemaphore of %d, %d workers on %d clients; permit/lock: uncontended acquire+release p50 of a permit over a lock's, interleaved on one client; weighted: every other worker takes 2 permits at once\n\n",
		c.SemLimit, c.SemWorkers, c.Clients)
	fmt.Fprintln(w, "| backend | permits/s | wait p99 | most inside | permit p50 | lock p50 | permit/lock | weighted acq/s | most permits |")
	fmt.Fprintln(w, "|---"+strings.Repeat("|--:", 8)+"|")
	for _, r := range rep.Results {
		cells := []string{r.Backend}
		switch sm := r.Semaphore; {
		case sm == nil:
			cells = append(cells, rep.missing("semaphore"), "", "", "", "", "", "", "")
		case sm.Unsupported:
			cells = append(cells, "unsupported", "", "", "", "", "", "", "")
		default:
			inside := fmt.Sprint(sm.MaxInside)
			if sm.Errors > 0 {
				inside += fmt.Sprintf(" (%d errors)", sm.Errors)
			}
			cells = append(cells, rate(sm.PermitsSec), dur(sm.WaitP99), inside, dur(sm.PermitP50), dur(sm.LockP50), fmt.Sprintf("%.2f", sm.Ratio))
			if sm.NoWeights {
				cells = append(cells, "unsupported", "")
			} else {
				cells = append(cells, rate(sm.WeightedSec), fmt.Sprint(sm.MostPermits))
			}
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
}
