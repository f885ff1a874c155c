// Package docs checks that the repository's Markdown points at things that
// exist (issue 19): every relative link reaches a file, and its #anchor a
// heading of that file, by GitHub's rules for heading IDs; every
// backticked path that names a file or directory of the repository (such
// as `config/inference.yaml` or `pkg/authn/keys.go`) names one that is
// there; and every `make TARGET` names a target of the Makefile. Docs go
// stale when code moves; this test is where they learn of it.
//
// It holds no code: the checks are in docs_test.go, over an fs.FS, so that
// a small in-memory fixture can show that each check fails when it should.
package docs
