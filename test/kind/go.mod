module github.com/l4xds/l4xds/test/kind

go 1.26.0
