package backend

import (
	"strconv"
	"strings"
)

// PermitTag is how a driver that keeps a permit's limit and weight as
// text writes them: "<limit>", or "<limit>x<weight>" for a claim of more
// than one permit. A version that predates weights reads the second form
// as no limit it knows: where it checks the limit of every permit it
// counts, it refuses rather than over-grants.
func PermitTag(limit, weight int) string {
	if weight > 1 {
		return strconv.Itoa(limit) + "x" + strconv.Itoa(weight)
	}
	return strconv.Itoa(limit)
}

// ParsePermitTag returns the limit and the weight of a PermitTag, and
// false for anything else.
func ParsePermitTag(s string) (limit, weight int, ok bool) {
	l, w, weighted := strings.Cut(s, "x")
	limit, err := strconv.Atoi(l)
	weight = 1
	if err == nil && weighted {
		weight, err = strconv.Atoi(w)
	}
	if err != nil || limit < 1 || weight < 1 {
		return 0, 0, false
	}
	return limit, weight, true
}
