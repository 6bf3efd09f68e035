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

func setBenchBackends(txn WriteTxn, w *Writer, i int) error {
	return w.SetBackends(txn, ServiceName("svc-"+strconv.Itoa(i)), SourceXDS, benchBackendParams(i, benchBackends, 8080)...)
}

func reportPerService(b *testing.B, heapBefore uint64, w *Writer) {
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "services/s")
	heap := int64(heapInUse()) - int64(heapBefore)
	b.ReportMetric(float64(heap)/float64(b.N), "heap-B/service")
	runtime.KeepAlive(w)
}

// inBatches calls write for 0..n-1, benchBatch calls per transaction.
func inBatches(b *testing.B, w *Writer, n int, write func(txn WriteTxn, i int) error) {
	for i := 0; i < n; i += benchBatch {
		txn := w.WriteTxn()
		for j := i; j < min(i+benchBatch, n); j++ {
			if err := write(txn, j); err != nil {
				b.Fatal(err)
			}
		}
		txn.Commit()
	}
}

func upsertBenchService(txn WriteTxn, w *Writer, i int) error {
	svc, fe := benchService(i)
	return w.UpsertServiceAndFrontends(txn, svc, fe)
}

// BenchmarkWriter_UpsertServiceAndFrontends upserts b.N new services with
// one frontend each, whose backends were set before.
func BenchmarkWriter_UpsertServiceAndFrontends(b *testing.B) {
	w := newTestWriter(b)
	inBatches(b, w, benchBatch, func(txn WriteTxn, i int) error { return setBenchBackends(txn, w, i) })

	before := heapInUse()
	b.ReportAllocs()
	b.ResetTimer()
	inBatches(b, w, b.N, func(txn WriteTxn, i int) error { return upsertBenchService(txn, w, i) })
	reportPerService(b, before, w)
}

// BenchmarkWriter_SetBackends sets benchBackends backends on each of b.N
// existing services, recomputing their frontends.
func BenchmarkWriter_SetBackends(b *testing.B) {
	w := newTestWriter(b)
	inBatches(b, w, b.N, func(txn WriteTxn, i int) error { return upsertBenchService(txn, w, i) })

	before := heapInUse()
	b.ReportAllocs()
	b.ResetTimer()
	inBatches(b, w, b.N, func(txn WriteTxn, i int) error { return setBenchBackends(txn, w, i) })
	reportPerService(b, before, w)
}

// BenchmarkWriter_SetBackendsOneChanged sets the 1000 backends of a service
// with one weight changed each time, as an EDS update for one endpoint does.
func BenchmarkWriter_SetBackendsOneChanged(b *testing.B) {
	const n = 1000
	w := newTestWriter(b)
	bes := make([]BackendParams, n)
	for i := range bes {
		ip := netip.AddrFrom4([4]byte{172, 16, byte(i >> 8), byte(i)})
		bes[i] = BackendParams{Address: NewL3n4Addr(ip, 8080, ANY), Weight: 1}
	}
	inBatches(b, w, 1, func(txn WriteTxn, i int) error {
		if err := upsertBenchService(txn, w, i); err != nil {
			return err
		}
		return w.SetBackends(txn, "svc-0", SourceXDS, bes...)
	})

	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		bes[i%n].Weight++
		txn := w.WriteTxn()
		if err := w.SetBackends(txn, "svc-0", SourceXDS, bes...); err != nil {
			b.Fatal(err)
		}
		txn.Commit()
	}
}
