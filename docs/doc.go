// Package docs holds the developers' and users' documents of alkblobfs
// (Markdown). It has no code: its tests keep architecture.md's import
// table true to the code, so the map cannot drift from the territory, and
// keep the pages' links, anchors and cited tests real (links_test.go).
package docs
