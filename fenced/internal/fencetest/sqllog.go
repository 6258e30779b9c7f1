package fencetest

import "fmt"

// The log table of a SQL store's writes, the same in every dialect: seq
// numbers the writes in commit order, since each guarded write appends the
// next one under the guard's row lock.

// CreateLog creates the log table.
func CreateLog(table string) string {
	return "CREATE TABLE IF NOT EXISTS " + table + " (seq INTEGER NOT NULL, who VARCHAR(16) NOT NULL, fence BIGINT NOT NULL)"
}

// InsertLog appends who's write with fence.
func InsertLog(table, who string, fence uint64) string {
	return fmt.Sprintf("INSERT INTO %s (seq, who, fence) SELECT COALESCE(MAX(seq), 0) + 1, '%s', %d FROM %s", table, who, fence, table)
}

// SelectLog lists who and fence of each write, in order.
func SelectLog(table string) string {
	return "SELECT who, fence FROM " + table + " ORDER BY seq"
}
