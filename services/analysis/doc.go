// Package analysis is the analysis service: it follows jobs.submitted,
// turns each job into its communication pattern (internal/pattern
// holds how) and publishes jobs.analyzed, or answers an invalid job with
// placement.rejected, each reason naming the field (such as "model.heads")
// and the arithmetic that failed.
package analysis
