package plane_test

// The pick reads a view built once per change of the instances (route.go).
// These tests hold it to the choices of the plain algorithm it replaced,
// written out below (refPick): the candidates listed and filtered on every
// pick. The benchmarks show its cost flat in the number of instances.

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/discovery"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// refReport is what the reference keeps of an instance's last load report:
// the requests running there that are not the client's, its engine's
// waiting requests and KV usage in whole percent.
type refReport struct{ others, waiting, kvPercent int }

// refPick is the pick as it was (candidates less excluded and suspects,
// else less excluded, else all; round robin over them, or the most free,
// less the waiting requests the engine reported, then the lowest KV usage,
// then in turn), computed from what the client lists. It returns the
// choice, ok false for ErrAtCapacity, and the round-robin turns it took.
func refPick(insts []discovery.Instance, capOf func([]byte) int, load map[uint64]int, reports map[uint64]refReport, suspects, exclude map[uint64]bool, turn uint64, admit bool) (id uint64, ok bool, turns uint64) {
	keep := func(avoidSuspects bool) []uint64 {
		var out []uint64
		for _, in := range insts {
			if !exclude[in.ID] && !(avoidSuspects && suspects[in.ID]) {
				out = append(out, in.ID)
			}
		}
		return out
	}
	cands := keep(true)
	if len(cands) == 0 {
		cands = keep(false)
	}
	if len(cands) == 0 {
		for _, in := range insts {
			cands = append(cands, in.ID)
		}
	}
	if capOf == nil {
		return cands[turn%uint64(len(cands))], true, 1
	}
	caps, largest := map[uint64]int{}, 0
	for _, in := range insts {
		caps[in.ID] = max(capOf(in.Meta), 0)
		largest = max(largest, caps[in.ID])
	}
	if largest == 0 {
		largest = math.MaxInt32
	}
	mostFree := func(cands []uint64, start uint64) (uint64, bool) {
		var best uint64
		bestFree, bestKV, found := math.MinInt, 0, false
		for k := range cands {
			id := cands[(start+uint64(k))%uint64(len(cands))]
			c, declared := caps[id], caps[id] > 0
			if !declared {
				c = largest
			}
			rep := reports[id]
			free := c - load[id] - rep.others
			if admit && declared && free <= 0 {
				continue
			}
			if eff := free - rep.waiting; !found || eff > bestFree || eff == bestFree && rep.kvPercent < bestKV {
				best, bestFree, bestKV, found = id, eff, rep.kvPercent, true
			}
		}
		return best, found
	}
	if id, ok := mostFree(cands, turn); ok {
		return id, true, 1
	}
	id, ok = mostFree(keep(false), turn+1)
	return id, ok, 2
}

// registerN registers n instances of path on rt's bus, the i-th with
// metadata meta(i), and returns their ids.
func registerN(tb testing.TB, rt *plane.Runtime, path string, n int, meta func(i int) []byte) []uint64 {
	tb.Helper()
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = discovery.NewInstanceID()
		l, err := discovery.Register(rt.Bus().Conn(), path, ids[i], meta(i))
		require.NoError(tb, err)
		tb.Cleanup(l.Close)
	}
	return ids
}

func pickMeta(i int) []byte {
	model := "a"
	if i%4 == 3 {
		model = "b"
	}
	return fmt.Appendf(nil, `{"model":%q,"max_num_seqs":%d}`, model, []int{0, 1, 2, 3, 4, 8}[i%6])
}

func modelA(meta []byte) bool { return string(meta[:len(`{"model":"a"`)]) == `{"model":"a"` }

// Every pick, with exclusions, suspects, admission, requests counted and
// uncounted and the workers' load reports (others' requests, their
// engines' waiting requests and KV usage), is the one the plain algorithm
// makes.
func TestPickMatchesThePlainAlgorithm(t *testing.T) {
	const path, n = "test.pick.generate", 24
	host := planetest.Embedded(t)
	all := registerN(t, host, path, n, pickMeta)
	base := planetest.Client(t, host, path)
	planetest.WaitInstances(t, base, n)
	for _, tc := range []struct {
		name     string
		filtered bool
		capOf    func([]byte) int
	}{{"round robin", false, nil}, {"round robin, one model", true, nil}, {"capacity", false, capacityOf}, {"capacity, one model", true, capacityOf}} {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			if tc.filtered {
				var err error
				c, err = base.Filtered(modelA)
				require.NoError(t, err)
				defer c.Close()
			}
			if tc.capOf != nil {
				c.SetCapacity(tc.capOf, nil)
				defer c.SetCapacity(nil, nil)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			var running []uint64
			reports := map[uint64]refReport{}
			for step := range 3000 {
				switch r := rng.IntN(10); {
				case r == 0:
					plane.Suspect(c, all[rng.IntN(n)])
				case r < 4 && len(running) > 0:
					k := rng.IntN(len(running))
					plane.Unload(c, running[k])
					running = slices.Delete(running, k, k+1)
					continue
				case r < 6 && tc.capOf != nil:
					reportLoad(t, c, rng, reports)
					continue
				}
				exclude := map[uint64]bool{}
				for range rng.IntN(3) * rng.IntN(2) {
					exclude[all[rng.IntN(n)]] = true
				}
				if rng.IntN(50) == 0 { // every instance excluded
					for _, id := range all {
						exclude[id] = true
					}
				}
				admit := rng.IntN(2) == 0
				insts, load, suspects, turn := c.Instances(), c.Running(), plane.Suspects(c), plane.Turn(c)
				want, ok, turns := refPick(insts, tc.capOf, load, reports, suspects, exclude, turn, admit)
				got, counted, err := plane.PickFor(c, plane.RoundRobin, 0, exclude, admit)
				if !ok {
					require.ErrorIs(t, err, plane.ErrAtCapacity, "step %d", step)
				} else {
					require.NoError(t, err, "step %d", step)
					require.Equal(t, want, got, "step %d", step)
				}
				require.Equal(t, turn+turns, plane.Turn(c), "step %d: turns taken", step)
				require.Equal(t, tc.capOf != nil && ok, counted)
				if counted {
					running = append(running, got)
				}
			}
			for _, id := range running {
				plane.Unload(c, id)
			}
		})
	}
}

// reportGen numbers the load reports the tests make up (each newer).
var reportGen atomic.Uint64

// reportLoad hands c a made-up load report of one of its instances (as a
// worker publishes it: others' requests, its engine's figures or not) and
// notes in reports what the reference is to make of it.
func reportLoad(t *testing.T, c *plane.Client, rng *rand.Rand, reports map[uint64]refReport) {
	t.Helper()
	insts := c.Instances()
	id := insts[rng.IntN(len(insts))].ID
	own, others := c.Running()[id], rng.IntN(4)
	rep := plane.LoadReport{Instance: id, Gen: reportGen.Add(1), Running: own + others}
	var ref refReport
	ref.others = others
	if w := []int{-1, 0, 1, 2, 5}[rng.IntN(5)]; w >= 0 {
		rep.Waiting, ref.waiting = &w, w
	}
	if kv := []float64{-1, 0, 0.25, 0.5, 0.999, 1}[rng.IntN(6)]; kv >= 0 {
		rep.KVUsage, ref.kvPercent = &kv, int(kv*100)
	}
	data, err := json.Marshal(rep)
	require.NoError(t, err)
	plane.DeliverLoad(c, data)
	reports[id] = ref
}

// A pick's allocations do not grow with the instances; its time barely
// does (O(log W) with capacity). 1,000 instances as one frontend sees a
// fleet of 1,000 workers.
func BenchmarkPick(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		host := planetest.Embedded(b)
		path := fmt.Sprintf("bench.pick%d.generate", n)
		registerN(b, host, path, n, pickMeta)
		c := planetest.Client(b, host, path)
		planetest.WaitInstances(b, c, n)
		model, err := c.Filtered(modelA)
		require.NoError(b, err)
		model.SetCapacity(capacityOf, nil)
		b.Run(fmt.Sprintf("round_robin/instances=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				if _, _, err := plane.PickFor(c, plane.RoundRobin, 0, nil, false); err != nil {
					b.Fatal(err)
				}
			}
		})
		// The frontend's: one model's instances, most free places, admitted
		// and uncounted again when the request ends.
		b.Run(fmt.Sprintf("capacity_one_model/instances=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				r, err := model.Reserve()
				if err != nil && !errors.Is(err, plane.ErrAtCapacity) {
					b.Fatal(err)
				}
				if r != nil {
					r.Release()
				}
			}
		})
		// A worker's load report, as every frontend reads each: decoded,
		// applied to the model's free tree (O(log W)).
		ids := model.InstanceIDs()
		reports := make([][]byte, 256)
		for i := range reports {
			reports[i] = fmt.Appendf(nil, `{"instance":%d,"gen":%d,"running":%d,"capacity":256,"free":%d}`, ids[i%len(ids)], 1000+i, i%256, 256-i%256)
		}
		b.Run(fmt.Sprintf("load_report/instances=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for i := range b.N {
				plane.DeliverLoad(c, reports[i%len(reports)])
			}
		})
		model.Close()
	}
}
