// Package docs holds the developers' and users' documents of alkblobfs
// (Markdown). It has no code: its test keeps architecture.md's import
// table true to the code, so the map cannot drift from the territory.
package docs
