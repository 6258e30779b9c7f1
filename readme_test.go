package locker_test

// The Go snippets of README.md are the bodies of the readme* functions
// below and the second import declaration, verbatim (less one tab of
// indentation). The functions compile with the package's tests, so a
// snippet that stops compiling fails the build; TestReadmeSnippets fails
// when README.md and this file drift apart, in either direction.

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
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

func readmeScheduled(ctx context.Context, client *locker.Client) error {
	err := client.TryDo(ctx, "daily-email", sendDailyEmail,
		locker.MinHold(5*time.Minute), locker.TTL(time.Minute))
	if errors.Is(err, locker.ErrNotAcquired) {
		return nil // another host has it, or had it less than 5 minutes ago
	}
	return err
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

func readmeDriver() {
	type Driver interface { // backend.Driver: it reports what the store did; the Client decides the rest
		TryAcquire(ctx context.Context, c backend.Claim) (backend.Grant, error) // one try; ErrNotAcquired when held
		Refresh(ctx context.Context, c backend.Claim) error                     // token-checked
		Release(ctx context.Context, c backend.Claim) error                     // token-checked
		Close() error
	}
	var _ Driver = backend.Driver(nil) // the same methods
}

// What the snippets call.
var (
	invoiceRuns, emailsSent, batchesWritten atomic.Int32

	runInvoices = func(ctx context.Context, fence uint64) error {
		invoiceRuns.Add(1)
		return nil
	}
	sendDailyEmail = func(ctx context.Context) error {
		emailsSent.Add(1)
		return nil
	}
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
	emailsSent.Store(0)
	batchesWritten.Store(0)
	t.Setenv("LOCKER_URL", "mem://readme")
	if err := readmeDo(ctx); err != nil || invoiceRuns.Load() != 1 {
		t.Fatalf("the Do snippet: err %v, %d runs, want nil and 1", err, invoiceRuns.Load())
	}

	store := "mem://readme-" + strconv.FormatInt(time.Now().UnixNano(), 10) // MinHold outlives a -count run
	a, err := locker.Open(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := locker.Open(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// Two hosts: the first runs the job, the second finds it held for the
	// minimum, although the first has finished.
	if err := readmeScheduled(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := readmeScheduled(ctx, b); err != nil {
		t.Fatal(err)
	}
	if n := emailsSent.Load(); n != 1 {
		t.Fatalf("the scheduled snippet ran the job %d times on two hosts, want 1", n)
	}

	if err := readmeAcquire(ctx, a); err != nil || batchesWritten.Load() != int32(len(batches)) {
		t.Fatalf("the Acquire snippet: err %v, %d batches written, want nil and %d", err, batchesWritten.Load(), len(batches))
	}
	if _, err := a.TryAcquire(ctx, "reindex"); err != nil {
		t.Fatalf("the Acquire snippet left its lock held: %v", err)
	}
}
