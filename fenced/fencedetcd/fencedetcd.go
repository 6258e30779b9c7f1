// Package fencedetcd guards writes to etcd with a lock's fence (see
// package fenced): the writes run in one transaction with the check, only
// if their fence is at least the highest one the resource's fence key has
// seen.
//
//	_, err := fencedetcd.Txn(ctx, cli, "/fences/account/alice", lock.Fence(),
//		clientv3.OpPut("/accounts/alice/balance", "80"))
//	if errors.Is(err, fenced.ErrStale) { ... } // a later holder has written
package fencedetcd

import (
	"context"
	"fmt"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockerhq/locker/fenced"
)

// Txn commits ops in one transaction if fence is at least the highest fence
// that fenceKey has seen, which fence then becomes; otherwise nothing is
// written and the error wraps fenced.ErrStale. ops must not write
// fenceKey.
func Txn(ctx context.Context, kv clientv3.KV, fenceKey string, fence uint64, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	switch {
	case fence == 0:
		return nil, fmt.Errorf("fencedetcd: %s: fence 0: the lock's backend issues no fences: %w", fenceKey, fenced.ErrInvalid)
	case fenceKey == "":
		return nil, fmt.Errorf("fencedetcd: an empty fence key: %w", fenced.ErrInvalid)
	}
	// Zero-padded, so that etcd's byte-wise comparison orders fences as
	// numbers. A value comparison on a missing key always fails, hence
	// the nested transaction for a key that exists.
	f := fmt.Sprintf("%020d", fence)
	write := append([]clientv3.Op{clientv3.OpPut(fenceKey, f)}, ops...)
	resp, err := kv.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(fenceKey), "=", 0)).
		Then(write...).
		Else(clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.Value(fenceKey), ">", f)},
			[]clientv3.Op{clientv3.OpGet(fenceKey)},
			write,
		)).Commit()
	if err != nil {
		return nil, fmt.Errorf("fencedetcd: %s: %w", fenceKey, err)
	}
	if resp.Succeeded {
		return resp, nil
	}
	nested := resp.Responses[0].GetResponseTxn()
	if !nested.Succeeded { // not above fence: written
		return resp, nil
	}
	seen := "a higher one"
	if kvs := nested.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
		if n, err := strconv.ParseUint(string(kvs[0].Value), 10, 64); err == nil {
			seen = strconv.FormatUint(n, 10)
		}
	}
	return nil, fmt.Errorf("fencedetcd: %s: fence %d is below %s, a later holder's: %w", fenceKey, fence, seen, fenced.ErrStale)
}
