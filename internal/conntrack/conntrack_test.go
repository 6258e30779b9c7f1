package conntrack

import (
	"context"
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// pair returns a tracked client side of a loopback TCP connection and its
// server side.
func pair(t *testing.T, tr *Tracker) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	tc, err := tr.Add(c)
	if err != nil {
		t.Fatal(err)
	}
	return tc, s
}

func TestCutClosesAndRefuses(t *testing.T) {
	tr := New()
	c, _ := pair(t, tr)
	if _, ok := c.(syscall.Conn); !ok {
		t.Fatal("a tracked TCP connection hides its syscall.Conn")
	}
	if tr.Len() != 1 {
		t.Fatalf("Len = %d, want 1", tr.Len())
	}
	tr.Cut()
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("Read on a cut connection succeeded")
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Add(raw); !errors.Is(err, ErrCut) {
		t.Fatalf("Add after Cut = %v, want ErrCut", err)
	}
	if tr.Len() != 0 {
		t.Fatalf("Len after Cut = %d, want 0", tr.Len())
	}
}

func TestInterruptEndsOnlyABoundedBlockedRead(t *testing.T) {
	tr := New()
	c, _ := pair(t, tr)
	done := make(chan error, 1)
	c.SetReadDeadline(time.Now().Add(time.Minute))
	go func() {
		_, err := c.Read(make([]byte, 1))
		done <- err
	}()
	var rs []Read
	for deadline := time.Now().Add(5 * time.Second); len(rs) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the blocked read never showed in Reading")
		}
		time.Sleep(time.Millisecond)
		rs = tr.Reading()
	}
	if !rs[0].Interrupt() {
		t.Fatal("Interrupt did not cut a blocked read with a deadline")
	}
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("the interrupted Read = %v, want a deadline error", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the interrupted Read did not return")
	}
	if rs[0].Interrupt() {
		t.Fatal("Interrupt cut a read that had ended")
	}

	// A read with no deadline (pub/sub's) is left alone.
	c2, s2 := pair(t, tr)
	c2.SetReadDeadline(time.Time{})
	go func() {
		_, err := c2.Read(make([]byte, 1))
		done <- err
	}()
	for deadline := time.Now().Add(5 * time.Second); len(tr.Reading()) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the blocked read never showed in Reading")
		}
		time.Sleep(time.Millisecond)
	}
	for _, r := range tr.Reading() {
		if r.Interrupt() {
			t.Fatal("Interrupt cut a read without a deadline")
		}
	}
	s2.Write([]byte{1})
	if err := <-done; err != nil {
		t.Fatalf("the read without a deadline = %v after the server wrote", err)
	}
}

// The cost of watching a call's context.
func BenchmarkCutOnEnd(b *testing.B) {
	t := New()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.ReportAllocs()
	for b.Loop() {
		t.CutOnEnd(ctx).Stop()
	}
}

// A read still blocked Grace after its call's context ended is cut; once
// the call stopped its watch, no read is, though one blocks.
func TestCutOnEnd(t *testing.T) {
	tr := New()
	c, _ := pair(t, tr)
	read := func() <-chan error {
		done := make(chan error, 1)
		c.SetReadDeadline(time.Now().Add(time.Minute))
		go func() {
			_, err := c.Read(make([]byte, 1))
			done <- err
		}()
		for deadline := time.Now().Add(5 * time.Second); len(tr.Reading()) == 0; {
			if time.Now().After(deadline) {
				t.Fatal("the blocked read never showed in Reading")
			}
			time.Sleep(time.Millisecond)
		}
		return done
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := tr.CutOnEnd(ctx)
	done := read()
	ended := time.Now()
	cancel()
	select {
	case err := <-done:
		if took := time.Since(ended); took < Grace {
			t.Errorf("cut %v after the context ended, want at least Grace (%v)", took, Grace)
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("the cut read returned %v, want a timeout", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the blocked read was not cut")
	}
	w.Stop()
	if tr.Cuts() != 1 {
		t.Fatalf("Cuts = %d, want 1", tr.Cuts())
	}

	// Stopped as the context ends: the next call's read is left alone.
	ctx, cancel = context.WithCancel(context.Background())
	w = tr.CutOnEnd(ctx)
	cancel()
	w.Stop()
	done = read()
	select {
	case err := <-done:
		t.Fatalf("a read after Stop was cut: %v", err)
	case <-time.After(3 * Grace):
	}
	if tr.Cuts() != 1 {
		t.Fatalf("Cuts = %d after a stopped watch, want 1", tr.Cuts())
	}
	if tr.CutOnEnd(context.Background()) != nil {
		t.Error("a context that never ends needs no watch")
	}
	var none *Tracker
	none.CutOnEnd(ctx).Stop() // a client the driver did not dial
}
