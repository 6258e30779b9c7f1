// Package sqltest is the test wiring of the SQL dialects, written once
// for the _test.go files of sqllock's packages: a conformance harness and
// a test database per dialect. Nothing else imports it.
package sqltest
