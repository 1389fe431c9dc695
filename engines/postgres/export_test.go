package postgres

// QueuedPuts is how many puts wait for a batch (tests: to know that the
// puts they started queued behind batches they hold).
func QueuedPuts(e *Engine) int {
	e.puts.mu.Lock()
	defer e.puts.mu.Unlock()
	return len(e.puts.queue)
}
