package history

import (
	"errors"
	"fmt"
)

// Write is one write a fenced resource accepted.
type Write struct {
	Who   string // the writer, for the report
	Fence uint64 // the fence it was sent with
}

// CheckWrites checks the writes a resource accepted, in the order it
// accepted them, for what a store that checks fences promises: no write
// lands after one with a higher fence, so that nothing a holder sends once
// a later holder has written lands. It returns one error per write out of
// order, joined, or nil.
func CheckWrites(writes []Write) error {
	var errs []error
	top := -1 // the write with the highest fence so far
	for i, w := range writes {
		switch {
		case top < 0 || w.Fence >= writes[top].Fence:
			top = i
		default:
			errs = append(errs, fmt.Errorf("write %d (%s, fence %d) landed after write %d (%s, fence %d)",
				i+1, w.Who, w.Fence, top+1, writes[top].Who, writes[top].Fence))
		}
	}
	return errors.Join(errs...)
}
