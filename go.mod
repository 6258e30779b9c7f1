module github.com/lockerhq/locker

go 1.26
