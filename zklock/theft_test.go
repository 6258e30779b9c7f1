package zklock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockerhq/locker"
	"github.com/lockerhq/locker/backend"
	"github.com/lockerhq/locker/internal/testenv"
)

// A holder whose node someone else deletes or overwrites is told at once
// (within watchDelay and a round trip when it happens before the driver
// watches the node), on a driver that dialled its connection and on one
// made by New; its own release is not reported as a loss.
func TestTheftIsReported(t *testing.T) {
	servers := testenv.ZKAddrs()
	testenv.Require(t, servers...)
	t.Parallel()
	other, _, err := zk.Connect(servers, 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	userConn, _, err := zk.Connect(servers, 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	defer userConn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := waitSession(ctx, userConn); err != nil {
		t.Fatal(err)
	}
	onNew, err := New(userConn, WithRoot("/locker-test"), WithSessionTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer onNew.Close()
	for _, c := range []struct {
		name string
		d    *Driver
	}{{"dialled", dial(t, servers)}, {"new", onNew}} {
		// early: at once, before the driver watches the node (watchDelay).
		for _, theft := range []string{"delete", "overwrite", "none", "early delete", "early overwrite"} {
			key := uniqueKey(t)
			lost := make(chan error, 1)
			l := backend.Claim{Key: key, Token: newToken(t), TTL: time.Second, OnLost: func(err error) { lost <- err }}
			if _, err := c.d.TryAcquire(ctx, l); err != nil {
				t.Fatal(err)
			}
			_, path, err := holderSession(other, c.d, key)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(theft, "early") {
				time.Sleep(100 * time.Millisecond) // let the watch be armed: this tests the notification
			}
			start := time.Now()
			switch strings.TrimPrefix(theft, "early ") {
			case "delete":
				err = other.Delete(path, -1)
			case "overwrite":
				_, err = other.Set(path, []byte("mine now"), -1)
			case "none":
				err = c.d.Release(ctx, l)
			}
			if err != nil {
				t.Fatalf("%s/%s: %v", c.name, theft, err)
			}
			select {
			case err := <-lost:
				if theft == "none" {
					t.Fatalf("%s: its own release reported as a loss: %v", c.name, err)
				}
				if !errors.Is(err, locker.ErrLost) {
					t.Fatalf("%s/%s: %v, want ErrLost", c.name, theft, err)
				}
				t.Logf("%s/%s: told %v after: %v", c.name, theft, time.Since(start).Round(time.Millisecond), err)
			case <-time.After(time.Second):
				if theft != "none" {
					t.Fatalf("%s/%s: no lost signal within a second", c.name, theft)
				}
			}
			if strings.HasSuffix(theft, "overwrite") {
				other.Delete(path, -1)
			}
		}
	}
}
