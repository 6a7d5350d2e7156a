module github.com/regroup-dev/regroup/go

go 1.26
