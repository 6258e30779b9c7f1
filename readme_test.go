package locker_test

// The Go snippets of README.md are the bodies of the readme* functions
// below and the second import declaration, verbatim (less one tab of
// indentation). The functions compile with the package's tests, so a
// snippet that stops compiling fails the build; TestReadmeSnippets fails
// when README.md and this file drift apart, in either direction.

import (
	"context"
	"database/sql"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/lockerhq/locker/fenced"
)

import (
	"github.com/lockerhq/locker"
	_ "github.com/lockerhq/locker/redislock" // or etcdlock, zklock, sqllock (sqllock/mysql, sqllock/sqlite), memcachelock, filelock, memlock
)

func readmeDo(ctx context.Context) error {
	client, err := locker.Open(ctx, os.Getenv("LOCKER_URL")) // e.g. redis://127.0.0.1:6379/0?namespace=billing
	if err != nil {
		return err // errors.Is(err, locker.ErrInvalidURL), locker.ErrPermission, ...
	}
	defer client.Close()

	return client.Do(ctx, "invoice-run", func(ctx context.Context) error {
		fence := locker.FromContext(ctx).Fence() // hand it to the storage you write to
		return runInvoices(ctx, fence)           // ctx is cancelled if the lock is lost
	}, locker.TTL(30*time.Second))
}

func readmeAcquire(ctx context.Context, client *locker.Client) error {
	l, err := client.Acquire(ctx, "reindex", locker.WaitAtMost(5*time.Second))
	if err != nil {
		return err // wraps locker.ErrNotAcquired when someone else held it for 5s
	}
	defer l.Release(ctx) // releases even once ctx has ended, within its own timeout

	for _, batch := range batches {
		select {
		case <-l.Lost(): // refresh refused, TTL ran out unconfirmed, session ended, Client closed
			return l.Err() // wraps locker.ErrLost: stop writing, someone else may hold it now
		default:
		}
		if err := writeBatch(ctx, batch, l.Fence()); err != nil { // the store refuses older fences
			return err
		}
	}
	return nil
}

func readmeTransfer(ctx context.Context, client *locker.Client, db *sql.DB, guard *fenced.Guard) error {
	accounts := []string{"account/alice", "account/bob"} // in any order: DoAll takes them in one
	return client.DoAll(ctx, accounts, func(ctx context.Context, set *locker.LockSet) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		for _, name := range set.Names() { // fenced.ErrStale once a later holder has written
			if err := guard.Advance(ctx, tx, name, set.Fence(name)); err != nil {
				return err
			}
		}
		if _, err := tx.ExecContext(ctx, moveMoney, "alice", "bob", 30); err != nil {
			return err
		}
		return tx.Commit()
	})
}

// What the snippets call.
var (
	invoiceRuns, batchesWritten atomic.Int32

	runInvoices = func(ctx context.Context, fence uint64) error {
		invoiceRuns.Add(1)
		return nil
	}
	moveMoney  = "UPDATE accounts SET balance = balance + CASE id WHEN ?1 THEN -?3 ELSE ?3 END WHERE id IN (?1, ?2)"
	batches    = []string{"a", "b", "c"}
	writeBatch = func(ctx context.Context, batch string, fence uint64) error {
		batchesWritten.Add(1)
		return nil
	}
)

func TestReadmeSnippets(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	src, err := os.ReadFile("readme_test.go")
	if err != nil {
		t.Fatal(err)
	}
	f, err := parser.ParseFile(fset, "readme_test.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	text := func(from, to token.Pos) string {
		return string(src[fset.Position(from).Offset:fset.Position(to).Offset])
	}
	var want []string // what README.md must show, in this file's order
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if !strings.HasPrefix(d.Name.Name, "readme") {
				continue
			}
			body := strings.Trim(text(d.Body.Lbrace+1, d.Body.Rbrace), "\n")
			lines := strings.Split(body, "\n")
			for i, l := range lines {
				lines[i] = strings.TrimPrefix(l, "\t")
			}
			want = append(want, strings.Join(lines, "\n"))
		case *ast.GenDecl:
			if d.Tok != token.IMPORT || !strings.Contains(text(d.Pos(), d.End()), `"github.com/lockerhq/locker"`) {
				continue
			}
			want = append(want, text(d.Pos(), d.End()))
		}
	}
	if len(want) < 4 {
		t.Fatalf("found %d snippets in readme_test.go, want the import and 3 functions", len(want))
	}

	var got []string
	for _, m := range regexp.MustCompile("(?ms)^```go\n(.*?)\n```$").FindAllStringSubmatch(string(readme), -1) {
		got = append(got, m[1])
	}
	shown := map[string]bool{}
	for _, g := range got {
		shown[g] = true
	}
	for _, w := range want {
		if !shown[w] {
			t.Errorf("README.md does not show this snippet of readme_test.go verbatim:\n%s", w)
		}
	}
	known := map[string]bool{}
	for _, w := range want {
		known[w] = true
	}
	for _, g := range got {
		if !known[g] {
			t.Errorf("README.md shows a Go snippet that readme_test.go does not compile (copy it there, as the body of a readme* function):\n%s", g)
		}
	}
}

// TestReadmeSnippetsRun runs the snippets on the in-process backend, so that
// they do what the README says they do.
func TestReadmeSnippetsRun(t *testing.T) {
	ctx := context.Background()
	invoiceRuns.Store(0)
	batchesWritten.Store(0)
	t.Setenv("LOCKER_URL", "mem://readme")
	if err := readmeDo(ctx); err != nil || invoiceRuns.Load() != 1 {
		t.Fatalf("the Do snippet: err %v, %d runs, want nil and 1", err, invoiceRuns.Load())
	}

	a, err := locker.Open(ctx, "mem://readme")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := readmeAcquire(ctx, a); err != nil || batchesWritten.Load() != int32(len(batches)) {
		t.Fatalf("the Acquire snippet: err %v, %d batches written, want nil and %d", err, batchesWritten.Load(), len(batches))
	}
	if _, err := a.TryAcquire(ctx, "reindex"); err != nil {
		t.Fatalf("the Acquire snippet left its lock held: %v", err)
	}

	db, err := sql.Open("sqlite", t.TempDir()+"/bank.db")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	guard, err := fenced.New(db, fenced.SQLite)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER); INSERT INTO accounts VALUES ('alice', 100), ('bob', 0)"); err != nil {
		t.Fatal(err)
	}
	if err := guard.CreateTable(ctx); err != nil {
		t.Fatal(err)
	}
	// A holder of alice's account before the transfer, paused, wakes
	// after it: its fence is refused.
	before, err := a.TryAcquire(ctx, "account/alice")
	if err != nil {
		t.Fatal(err)
	}
	before.Release(ctx)
	if err := readmeTransfer(ctx, a, db, guard); err != nil {
		t.Fatalf("the transfer snippet: %v", err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := guard.Advance(ctx, tx, "account/alice", before.Fence()); !errors.Is(err, fenced.ErrStale) {
		t.Fatalf("Advance with an earlier holder's fence after the transfer: %v, want fenced.ErrStale", err)
	}
	tx.Rollback()
	var alice, bob int
	if err := db.QueryRow("SELECT (SELECT balance FROM accounts WHERE id = 'alice'), (SELECT balance FROM accounts WHERE id = 'bob')").Scan(&alice, &bob); err != nil || alice != 70 || bob != 30 {
		t.Fatalf("after the transfer snippet: alice %d, bob %d (%v), want 70 and 30", alice, bob, err)
	}
}
