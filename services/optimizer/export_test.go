package optimizer

import "context"

// Rebuild restores the state from the streams without starting the
// handlers, as Run does first.
func (s *Service) Rebuild(ctx context.Context) error { return s.rebuild(ctx) }
