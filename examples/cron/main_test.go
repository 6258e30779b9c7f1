package main

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRun runs the example on its default backend: in each round one host
// runs the job and the others skip it, the fences grow, and the late write
// with an older fence is refused.
func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := config{hosts: 4, skew: 100 * time.Millisecond, minHold: time.Second, period: 1500 * time.Millisecond, rounds: 2}
	var out bytes.Buffer
	ran, err := run(ctx, "mem://cron-example-test", cfg, &out)
	t.Logf("\n%s", &out)
	if err != nil {
		t.Fatal(err)
	}
	if len(ran) != cfg.rounds || ran[0] == 0 || ran[1] <= ran[0] {
		t.Fatalf("fences of the rounds' runs = %v, want %d, each greater than the last", ran, cfg.rounds)
	}
	s := out.String()
	if n := strings.Count(s, "ran the job"); n != cfg.rounds {
		t.Errorf("%d runs of the job, want one per round (%d)", n, cfg.rounds)
	}
	if n := strings.Count(s, "skipped"); n != cfg.rounds*(cfg.hosts-1) {
		t.Errorf("%d skips, want %d", n, cfg.rounds*(cfg.hosts-1))
	}
	if !strings.Contains(s, "stale fence") || !strings.Contains(s, "(fence "+strconv.FormatUint(ran[1], 10)+")\nlate write") {
		t.Errorf("the output does not show the newest result kept and the late write refused")
	}
}
