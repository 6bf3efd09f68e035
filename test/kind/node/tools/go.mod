module github.com/l4xds/l4xds/test/kind/node/tools

go 1.22
