// SPDX-License-Identifier: Apache-2.0

package bpf

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/cilium/ebpf"
)

// The program is split into global functions so that the verifier checks
// each once; this keeps an eye on what it costs. The limit is far above
// today's figure (about 8k instructions): crossing it means a change made
// the verifier walk paths it did not before. (The stack, logged, is
// bounded by the kernel itself: 512 bytes for a chain of calls.)
const maxProcessedInsns = 100_000

var (
	processedRe = regexp.MustCompile(`processed (\d+) insns`)
	stackRe     = regexp.MustCompile(`stack depth ([\d+]+)`)
)

func TestVerifierBudget(t *testing.T) {
	var objs L4xdsObjects
	load(t, &objs, &ebpf.CollectionOptions{Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats}})
	defer objs.Close()
	log := objs.L4xdsIngress.VerifierLog

	m := processedRe.FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("no instruction count in the verifier log:\n%s", log)
	}
	insns, _ := strconv.Atoi(m[1])
	s := stackRe.FindStringSubmatch(log)
	if s == nil {
		t.Fatalf("no stack depth in the verifier log:\n%s", log)
	}
	t.Logf("verifier: %d instructions processed; stack depth per function %s", insns, s[1])
	if insns > maxProcessedInsns {
		t.Errorf("the verifier processed %d instructions, more than %d", insns, maxProcessedInsns)
	}
}
