package micros

import (
	"math"
	"testing"
	"time"
)

func TestOfRoundsUp(t *testing.T) {
	for ttl, want := range map[time.Duration]int64{
		time.Nanosecond:                    1,
		time.Microsecond:                   1,
		time.Microsecond + 1:               2,
		time.Second:                        1e6,
		time.Duration(math.MaxInt64):       math.MaxInt64/1000 + 1,
		time.Duration(math.MaxInt64 - 807): math.MaxInt64 / 1000,
	} {
		if got, err := Of("", ttl); err != nil || got != want {
			t.Errorf("Of(%d) = %d, %v; want %d", ttl, got, err, want)
		}
	}
	if _, err := Of("", 0); err == nil {
		t.Error("Of(0): no error")
	}
}
