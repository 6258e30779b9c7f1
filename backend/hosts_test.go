package backend

import (
	"errors"
	"net/url"
	"slices"
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
}
