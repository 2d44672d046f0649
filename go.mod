module github.com/governor-project/governor

go 1.26.8
