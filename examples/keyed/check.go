//go:build unix

package main

import (
	"bytes"
	"cmp"
	"fmt"
	"io"
	"slices"
	"time"
)

// checkReport is what check found.
type checkReport struct {
	problems   []string
	resumed    []string // how each killed run was resumed
	inversions int      // adjacent runs of a key, by start, whose seqs go down
	pairs      int
	repeats    int // finished runs beyond one per task
	grants     int // distinct (key, fence): lock grants that ran tasks
}

// check verifies the history against what keyed promises on every backend:
//   - exclusion: no two runs of a key overlap; a killed run lasts until the
//     store was last seen holding its lock;
//   - fences: along a key's runs in start order the fence never goes down,
//     and goes up whenever the process changes (a new grant);
//   - order within a process: a process runs a key's tasks in the order it
//     took them (its Go calls), so the ones it popped from the queue in
//     submission order;
//   - every task finished at least once;
//   - every killed run was resumed by another process, after the store was
//     last seen holding the killed run's lock, under a higher fence.
//
// Order across processes is counted, not checked: a worker pops a task and
// then asks for its lock, and the other worker can ask first; a fair store
// grants batches in the order the processes asked, which is not the order
// of the queue.
func check(res *result) checkReport {
	var rep checkReport
	bad := func(format string, a ...any) { rep.problems = append(rep.problems, fmt.Sprintf(format, a...)) }
	byKey := map[string][]run{}
	for _, r := range res.runs {
		byKey[r.Key] = append(byKey[r.Key], r)
	}
	for _, kr := range res.killed {
		r := kr.run
		r.End = kr.LastHeld
		byKey[r.Key] = append(byKey[r.Key], r)
	}
	grants := map[string]bool{}
	for key, rs := range byKey {
		slices.SortFunc(rs, func(a, b run) int { return cmp.Compare(a.Start, b.Start) })
		var lastEnd int64
		for i, r := range rs {
			grants[fmt.Sprint(key, r.Fence)] = true
			if i == 0 {
				lastEnd = r.End
				continue
			}
			p := rs[i-1]
			if r.Start <= lastEnd {
				bad("%s: task #%d (%s) started %v before an earlier run ended", key, r.Seq, r.Proc, time.Duration(lastEnd-r.Start))
			}
			lastEnd = max(lastEnd, r.End)
			if r.Fence < p.Fence || (r.Proc != p.Proc && r.Fence == p.Fence) {
				bad("%s: fence %d (%s) after %d (%s)", key, r.Fence, r.Proc, p.Fence, p.Proc)
			}
		}
		// Within each process: take order, and queue order for popped tasks.
		for _, proc := range []string{"w1", "w2"} {
			var lastTake, lastSeq int
			for _, r := range rs {
				if r.Proc != proc {
					continue
				}
				if r.Take <= lastTake {
					bad("%s on %s: take %d ran after take %d", key, proc, r.Take, lastTake)
				}
				lastTake = r.Take
				if !r.Reclaimed {
					if r.Seq <= lastSeq {
						bad("%s on %s: popped task #%d ran after #%d", key, proc, r.Seq, lastSeq)
					}
					lastSeq = r.Seq
				}
			}
		}
	}
	rep.grants = len(grants)
	for _, rs := range byKey {
		// Finished runs only: a killed run's End is its lock's.
		rs = slices.DeleteFunc(slices.Clone(rs), func(r run) bool {
			return slices.ContainsFunc(res.killed, func(k killed) bool { return k.Proc == r.Proc && k.Start == r.Start })
		})
		for i := 1; i < len(rs); i++ {
			rep.pairs++
			if rs[i].Seq < rs[i-1].Seq {
				rep.inversions++
			}
		}
	}

	ran := map[int]int{}
	for _, r := range res.runs {
		ran[r.ID]++
	}
	total := res.cfg.groups * res.cfg.tasks
	for id := range total {
		if ran[id] == 0 {
			bad("task %d never finished", id)
		}
	}
	rep.repeats = len(res.runs) - len(ran)
	if res.done != int64(total) {
		bad("%d tasks marked done, want %d", res.done, total)
	}

	for _, kr := range res.killed {
		if kr.LastHeld < res.killedAt {
			bad("%s: the killed run's lock (fence %d) was never seen held after the kill", kr.Key, kr.Fence)
		}
		i := slices.IndexFunc(res.runs, func(r run) bool {
			return r.ID == kr.ID && r.Proc != kr.Proc && r.Start > kr.LastHeld && r.Fence > kr.Fence
		})
		if i < 0 {
			bad("%s #%d, killed on %s: not resumed by another process after its lock was freed", kr.Key, kr.Seq, kr.Proc)
			continue
		}
		r := res.runs[i]
		rep.resumed = append(rep.resumed, fmt.Sprintf("%s #%d: killed on %s at fence %d, resumed on %s at +%v, fence %d, %v after the lock was last seen held",
			kr.Key, kr.Seq, kr.Proc, kr.Fence, r.Proc, since(res.t0, r.Start), r.Fence, time.Duration(r.Start-kr.LastHeld).Round(time.Millisecond)))
	}
	return rep
}

// report prints each key's runs in start order ("3a": task #3 on w1, "x":
// killed, "r": reclaimed), then what check found.
func report(res *result, out io.Writer) {
	byKey := map[string][]run{}
	for _, r := range res.runs {
		byKey[r.Key] = append(byKey[r.Key], r)
	}
	for _, kr := range res.killed {
		byKey[kr.Key] = append(byKey[kr.Key], kr.run)
	}
	var ks []string
	for key := range byKey {
		ks = append(ks, key)
	}
	slices.Sort(ks)
	for _, key := range ks {
		rs := byKey[key]
		slices.SortFunc(rs, func(a, b run) int { return cmp.Compare(a.Start, b.Start) })
		var b bytes.Buffer
		for _, r := range rs {
			fmt.Fprintf(&b, " %d%s", r.Seq, map[string]string{"w1": "a", "w2": "b"}[r.Proc])
			if r.End == 0 {
				b.WriteString("x")
			}
			if r.Reclaimed {
				b.WriteString("r")
			}
		}
		fmt.Fprintf(out, "%-18s%s\n", key, b.String())
	}
	rep := check(res)
	for _, s := range rep.resumed {
		fmt.Fprintln(out, "resumed:", s)
	}
	fmt.Fprintf(out, "%d runs finished (%d repeated), %d tasks done, %d lock grants; %d of %d adjacent runs of a key out of submission order across processes (not promised)\n",
		len(res.runs), rep.repeats, res.done, rep.grants, rep.inversions, rep.pairs)
	if len(rep.problems) == 0 {
		fmt.Fprintln(out, "ok: no overlap per key, fences increase, each process kept its order, every task done, the killed task resumed after its lock was freed")
	}
	for _, p := range rep.problems {
		fmt.Fprintln(out, "FAIL:", p)
	}
}
