package filelock

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/lockerhq/locker/backend"
)

func TestDiagnose(t *testing.T) {
	levels := func(d *Driver) map[string]backend.Level {
		t.Helper()
		fs, err := d.Diagnose(context.Background(), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]backend.Level{}
		for _, f := range fs {
			got[f.Check] = f.Level
		}
		return got
	}
	dir := t.TempDir()
	d, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for c, l := range levels(d) {
		if l != backend.Sound {
			t.Errorf("a private directory on a local disk: %s %v", c, l)
		}
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	d2, err := New(dir, WithSync(false))
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if got := levels(d2); got["file.permissions"] != backend.Warning || got["file.sync"] != backend.Warning {
		t.Errorf("a world-writable directory, sync off: %v", got)
	}
}
