package backend

import (
	"errors"
	"net/url"
	"slices"
	"strings"
	"testing"
)

func TestHosts(t *testing.T) {
	for host, want := range map[string][]string{
		"a":                   {"a:99"},
		"a:1":                 {"a:1"},
		"a:1,b,c:3":           {"a:1", "b:99", "c:3"},
		"127.0.0.1,127.0.0.2": {"127.0.0.1:99", "127.0.0.2:99"},
		"[::1]:5,[::1]":       {"[::1]:5", "[::1]:99"},
	} {
		got, err := Hosts(&url.URL{Host: host}, "99")
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("Hosts(%q) = %v, %v; want %v", host, got, err, want)
		}
	}
	for _, host := range []string{"", ",", "a,", ",a", "a,,b", "a:", ":1", "[::1", "a:b:c"} {
		got, err := Hosts(&url.URL{Host: host}, "99")
		if !errors.Is(err, ErrInvalidURL) {
			t.Errorf("Hosts(%q) = %v, %v; want ErrInvalidURL", host, got, err)
		}
	}
	// No "//": the user information and host are opaque, never a default server.
	u, _ := url.Parse("redis:s3cret@127.0.0.1:6379")
	if got, err := Hosts(u, "99"); !errors.Is(err, ErrInvalidURL) || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("Hosts(%q) = %v, %v; want ErrInvalidURL without the password", u, got, err)
	}
}
