package fencedetcd_test

import (
	"context"
	"errors"
	"path"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/lockerhq/locker/fenced"
	"github.com/lockerhq/locker/fenced/fencedetcd"
	"github.com/lockerhq/locker/fenced/internal/fencetest"
	"github.com/lockerhq/locker/internal/history"
	"github.com/lockerhq/locker/internal/testenv"
	"github.com/lockerhq/locker/internal/testutil"
)

// open opens a resource as a fence key and a key per write, under one
// prefix: their revisions are the order etcd took them in.
func open(_ context.Context, id, _ string) (fencetest.Store, func(), error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: testenv.EtcdEndpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, nil, err
	}
	dir := "/fenced-" + id
	return store{cli, dir}, func() { cli.Delete(context.Background(), dir, clientv3.WithPrefix()); cli.Close() }, nil
}

type store struct {
	cli *clientv3.Client
	dir string
}

func (s store) Write(ctx context.Context, who string, fence uint64, bypass bool) error {
	put := clientv3.OpPut(s.dir+"/log/"+who, strconv.FormatUint(fence, 10))
	if bypass {
		_, err := s.cli.Do(ctx, put)
		return err
	}
	_, err := fencedetcd.Txn(ctx, s.cli, s.dir+"/fence", fence, put)
	return err
}

func (s store) Writes(ctx context.Context) ([]history.Write, error) {
	r, err := s.cli.Get(ctx, s.dir+"/log/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortAscend))
	if err != nil {
		return nil, err
	}
	ws := make([]history.Write, len(r.Kvs))
	for i, kv := range r.Kvs {
		ws[i].Who = path.Base(string(kv.Key))
		if ws[i].Fence, err = strconv.ParseUint(string(kv.Value), 10, 64); err != nil {
			return nil, err
		}
	}
	return ws, nil
}

func TestPausedHolder(t *testing.T) {
	testenv.Require(t, testenv.EtcdEndpoints()...)
	fencetest.Paused(t, open)
}

func TestOverrunningHolders(t *testing.T) {
	testenv.Require(t, testenv.EtcdEndpoints()...)
	fencetest.Overrunning(t, open)
}

// Fences compare as numbers, not as strings (10 after 9), on a fence key
// that exists or not; bad input is refused before any request.
func TestFences(t *testing.T) {
	testenv.Require(t, testenv.EtcdEndpoints()...)
	ctx := context.Background()
	s, drop, err := open(ctx, testutil.RandHex(4), "")
	if err != nil {
		t.Fatal(err)
	}
	defer drop()
	cli, fk := s.(store).cli, s.(store).dir+"/fence"
	for _, f := range []uint64{9, 9, 10, 1 << 62} {
		if _, err := fencedetcd.Txn(ctx, cli, fk, f); err != nil {
			t.Fatalf("fence %d: %v", f, err)
		}
	}
	if _, err := fencedetcd.Txn(ctx, cli, fk, 10); !errors.Is(err, fenced.ErrStale) {
		t.Fatalf("10 after 2^62: %v, want ErrStale", err)
	}
	if _, err := fencedetcd.Txn(ctx, cli, fk, 0); !errors.Is(err, fenced.ErrInvalid) {
		t.Fatalf("fence 0: %v, want ErrInvalid", err)
	}
	if _, err := fencedetcd.Txn(ctx, cli, "", 1); !errors.Is(err, fenced.ErrInvalid) {
		t.Fatalf("no fence key: %v, want ErrInvalid", err)
	}
}
