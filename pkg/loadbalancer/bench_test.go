// SPDX-License-Identifier: Apache-2.0

package loadbalancer

import (
	"net/netip"
	"runtime"
	"strconv"
	"testing"
)

// The benchmarks write in transactions of benchBatch services, as the xDS
// side does for the clusters of one response, and report throughput and the
// heap retained by the tables per service. They assert nothing.

const (
	benchBatch    = 1000
	benchBackends = 10
)

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func benchService(i int) (*Service, FrontendParams) {
	name := ServiceName("svc-" + strconv.Itoa(i))
	vip := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
	return &Service{Name: name, Source: SourceXDS},
		FrontendParams{Address: NewL3n4Addr(vip, 80, TCP)}
}

func benchBackendParams(i, n int, port uint16) []BackendParams {
	bes := make([]BackendParams, n)
	for j := range bes {
		ip := netip.AddrFrom4([4]byte{172, byte(i >> 8), byte(i), byte(j)})
		bes[j] = BackendParams{Address: NewL3n4Addr(ip, port, ANY), Weight: 1}
	}
	return bes
}

func reportPerService(b *testing.B, heapBefore uint64, w *Writer) {
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "services/s")
	heap := int64(heapInUse()) - int64(heapBefore)
	b.ReportMetric(float64(heap)/float64(b.N), "heap-B/service")
	runtime.KeepAlive(w)
}

// BenchmarkWriter_UpsertServiceAndFrontends upserts b.N new services with
// one frontend each, whose backends were set before.
func BenchmarkWriter_UpsertServiceAndFrontends(b *testing.B) {
	w := newTestWriter(b)
	txn := w.WriteTxn()
	for i := range benchBatch {
		if err := w.SetBackends(txn, ServiceName("svc-"+strconv.Itoa(i)), SourceXDS, benchBackendParams(i, benchBackends, 8080)...); err != nil {
			b.Fatal(err)
		}
	}
	txn.Commit()

	before := heapInUse()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += benchBatch {
		txn := w.WriteTxn()
		for j := i; j < min(i+benchBatch, b.N); j++ {
			svc, fe := benchService(j)
			if err := w.UpsertServiceAndFrontends(txn, svc, fe); err != nil {
				b.Fatal(err)
			}
		}
		txn.Commit()
	}
	reportPerService(b, before, w)
}

// BenchmarkWriter_SetBackends sets benchBackends backends on each of b.N
// existing services, recomputing their frontends.
func BenchmarkWriter_SetBackends(b *testing.B) {
	w := newTestWriter(b)
	for i := 0; i < b.N; i += benchBatch {
		txn := w.WriteTxn()
		for j := i; j < min(i+benchBatch, b.N); j++ {
			svc, fe := benchService(j)
			if err := w.UpsertServiceAndFrontends(txn, svc, fe); err != nil {
				b.Fatal(err)
			}
		}
		txn.Commit()
	}

	before := heapInUse()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += benchBatch {
		txn := w.WriteTxn()
		for j := i; j < min(i+benchBatch, b.N); j++ {
			name := ServiceName("svc-" + strconv.Itoa(j))
			if err := w.SetBackends(txn, name, SourceXDS, benchBackendParams(j, benchBackends, 8080)...); err != nil {
				b.Fatal(err)
			}
		}
		txn.Commit()
	}
	reportPerService(b, before, w)
}
