//go:build !linux

package natsserver

import "errors"

// freeBytes is not implemented here: the store keeps its configured limit.
func freeBytes(string) (uint64, error) { return 0, errors.ErrUnsupported }
