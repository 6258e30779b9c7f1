package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/internal/testutil"
)

// TestRunRedis runs the example on the test Redis and checks that its dump
// shows the service's telemetry.
func TestRunRedis(t *testing.T) {
	addr := testenv.RedisAddr()
	testenv.Require(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	// A server just started refuses new names for a TTL unless
	// restart_delay=0; a namespace of the test's own.
	url := "redis://" + addr + "/0?restart_delay=0&namespace=otel-example-" + testutil.RandHex(4)
	if err := run(ctx, url, &out); err != nil {
		t.Fatal(err)
	}
	dump := out.String()
	t.Logf("\n%s", dump)
	per := workers * rounds / len(names)
	for _, re := range []string{
		`(?m)^    mode=exclusive name=invoices outcome=granted wait=true +count=` + strconv.Itoa(per) + ` `,
		`(?m)^    mode=exclusive name=reports outcome=released +count=` + strconv.Itoa(per) + ` `,
		`(?m)^    mode=exclusive name=heartbeat outcome=lost +count=1 sum=`,
		`(?m)^    lost.cause=expired mode=exclusive name=heartbeat +value=1$`,
		`(?m)^    mode=exclusive name=invoices +value=0$`, // none held at the end
	} {
		if !regexp.MustCompile(re).MatchString(dump) {
			t.Errorf("the dump has no line matching %s", re)
		}
	}
	// One Do span per turn, each with its acquisition below it; the
	// heartbeat's acquisition on its own.
	if n := strings.Count(dump, "\n  locker.do "); n != workers*rounds {
		t.Errorf("%d locker.do spans, want %d", n, workers*rounds)
	}
	if n := strings.Count(dump, "\n    locker.acquire "); n != workers*rounds {
		t.Errorf("%d locker.acquire spans below a Do, want %d", n, workers*rounds)
	}
	if !regexp.MustCompile(`(?m)^  locker.acquire .* name=heartbeat outcome=granted owner=stalled wait=false`).MatchString(dump) {
		t.Errorf("no span for the heartbeat's acquisition")
	}
}
