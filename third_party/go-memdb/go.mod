module github.com/hashicorp/go-memdb

go 1.13

require (
	github.com/hashicorp/go-immutable-radix v1.3.1
	github.com/hashicorp/golang-lru v0.5.4 // indirect
)
