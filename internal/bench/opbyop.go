package bench

import (
	"slices"
	"time"
)

// OpByOp runs ops interleaved op by op, per times each in every one of
// rounds rounds (the order rotates from one turn to the next, so no op
// always follows the same one), and returns each op's median time per
// round: med[op][round]. i numbers every call, for unique names. It stops
// at the first error.
func OpByOp(rounds, per int, ops []func(i int) error) (med [][]time.Duration, err error) {
	med = make([][]time.Duration, len(ops))
	i := 0
	for range rounds {
		times := make([][]time.Duration, len(ops))
		for c := range per {
			for k := range ops {
				s := (k + c) % len(ops)
				i++
				start := time.Now()
				if err := ops[s](i); err != nil {
					return nil, err
				}
				times[s] = append(times[s], time.Since(start))
			}
		}
		for s := range ops {
			med[s] = append(med[s], Percentile(times[s], 0.5))
		}
	}
	return med, nil
}

// Ratios returns the median, least and greatest over the rounds of
// num[r]/den[r]: with the floor as num and a subject as den, the subject's
// ops/s over the floor's.
func Ratios(num, den []time.Duration) (med, lo, hi float64) {
	rs := make([]float64, len(num))
	for r := range num {
		rs[r] = float64(num[r]) / float64(den[r])
	}
	slices.Sort(rs)
	return rs[len(rs)/2], rs[0], rs[len(rs)-1]
}
