package clitest

import (
	"encoding/json"
)

// sweepJSON runs one sweep and returns its report.
func (c *CLI) SweepJSON() map[string]any {
	c.T.Helper()
	var rep map[string]any
	if err := json.Unmarshal([]byte(c.OK("sweep", "--json")), &rep); err != nil {
		c.T.Fatal(err)
	}
	if rep["aborted"] != nil {
		c.T.Fatalf("sweep aborted: %v", rep)
	}
	return rep
}
