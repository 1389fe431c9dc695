package postgres

// QueuedPuts is how many puts wait for a batch (tests: to know that the
// puts they started queued behind batches they hold).
func QueuedPuts(e *Engine) int { return e.puts.group.Queued() }

// FastBatches is how many put batches committed as one statement, with no
// transaction of their own (putfast.go).
func FastBatches(e *Engine) int64 { return e.puts.fastBatches.Load() }

// TxBatches is how many put batches the one-statement path handed to a
// transaction (a job's statement, a refusal, a failed guard).
func TxBatches(e *Engine) int64 { return e.puts.txBatches.Load() }

// PutRunners is how many batches of one engine run at once.
const PutRunners = putRunners
