// SPDX-License-Identifier: Apache-2.0

// Package docs keeps the generated parts of Documentation/ equal to what the
// binaries print: the agent's flag table in configuration.md and the command
// reference in cli.md are rendered from --help, and the start-up errors
// listed in troubleshooting.md are the agent's own. Its tests fail when the
// documents drift; `make docs` (go test ./internal/docs -update) rewrites the
// generated parts.
package docs
