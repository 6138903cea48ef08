package nodegrpc

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	nodev1 "github.com/cubicle-dev/cubicle/api/proto/node/v1"
	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/phase"
)

// fill sets every field of v, recursively, to a value that is not its
// zero: a field added to a Go struct and not to the proto then fails the
// round trips below instead of being dropped on the wire.
func fill(v reflect.Value, path string) {
	switch v.Interface().(type) {
	case time.Time:
		v.Set(reflect.ValueOf(time.Date(2026, 12, 5, 1, 2, 3, 456789, time.UTC)))
		return
	case netip.Addr:
		v.Set(reflect.ValueOf(netip.MustParseAddr("10.11.12.13")))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString("v-" + path)
	case reflect.Int, reflect.Int32, reflect.Int64:
		v.SetInt(int64(7 + len(path)))
	case reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(9 + len(path)))
	case reflect.Float64:
		v.SetFloat(1.5)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), path)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			fill(s.Index(i), fmt.Sprintf("%s[%d]", path, i))
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k, path+".key")
		fill(e, path+".elem")
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), path+"."+v.Type().Field(i).Name)
			}
		}
	default:
		panic("fill: no value for " + v.Type().String() + " at " + path)
	}
}

func filled[T any]() T {
	var x T
	fill(reflect.ValueOf(&x).Elem(), reflect.TypeOf(x).Name())
	return x
}

// wire marshals and unmarshals m, as a call does.
func wire[M proto.Message](t *testing.T, m M) M {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	out := m.ProtoReflect().New().Interface().(M)
	if err := proto.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func same(t *testing.T, what string, want, got any) {
	t.Helper()
	if !reflect.DeepEqual(want, got) {
		t.Errorf("%s changed on the wire:\nsent %+v\n got %+v", what, want, got)
	}
}

// Every field of every struct that crosses survives the wire, and so does
// the difference between nil and empty where Go gives it a meaning.
func TestStructsSurviveTheWire(t *testing.T) {
	cr := filled[node.CreateRequest]()
	same(t, "CreateRequest", cr, createFromProto(wire(t, createToProto(cr))))
	info := filled[node.Info]()
	same(t, "Info", info, infoFromProto(wire(t, infoToProto(info))))
	sb := filled[node.Sandbox]()
	got, err := sandboxFromProto(wire(t, sandboxToProto(sb)))
	if err != nil {
		t.Fatal(err)
	}
	same(t, "Sandbox", sb, got)
	st := filled[node.Stats]()
	same(t, "Stats", st, statsFromProto(wire(t, statsToProto(st))))
	sn := filled[node.Snapshot]()
	same(t, "Snapshot", sn, snapshotFromProto(wire(t, snapshotToProto(sn))))
	ref := filled[node.VolumeRef]()
	same(t, "VolumeRef", ref, refFromProto(wire(t, refToProto(ref))))
	dev := filled[accel.Device]()
	same(t, "Device", dev, deviceFromProto(wire(t, deviceToProto(dev))))
	ev := filled[accel.Event]()
	same(t, "Event", ev, eventFromProto(wire(t, eventToProto(ev))))
	ex := filled[node.Exit]()
	same(t, "Exit", ex, exitFromProto(wire(t, exitToProto(ex))))

	// nil and empty: no accelerators vs a manager with none; the default
	// DNS opening vs none; no upstream, no contract; an invalid address.
	for _, i := range []node.Info{{}, {Accelerators: map[accel.State]int{}}} {
		same(t, "Info.Accelerators", i.Accelerators, infoFromProto(wire(t, infoToProto(i))).Accelerators)
	}
	for _, p := range []network.Policy{{}, {DNSServers: &[]string{}}} {
		same(t, "Policy", p, policyFromProto(wire(t, policyToProto(p))))
	}
	same(t, "empty CreateRequest", node.CreateRequest{}, createFromProto(wire(t, createToProto(node.CreateRequest{}))))
	if got, err := sandboxFromProto(wire(t, sandboxToProto(node.Sandbox{ID: "x"}))); err != nil || got.Addr.IsValid() {
		t.Errorf("a sandbox without an address: %+v %v", got, err)
	}
	if _, err := sandboxFromProto(&nodev1.Sandbox{Id: "x", Addr: "not an address"}); err == nil {
		t.Error("a bad address from the node was accepted")
	}
}

// A node's phases cross the wire as they were; a name outside phase.Names
// (or a negative duration) from a hostile node is dropped, so it cannot
// mint label values in the control plane's histogram.
func TestPhasesRoundTrip(t *testing.T) {
	in := []phase.Phase{{Name: phase.Network, Duration: 3 * time.Millisecond}, {Name: phase.Disk, Duration: 25 * time.Millisecond}}
	wire := append(phasesToProto(in), &nodev1.Phase{Name: "evil\"label", Nanos: 1}, &nodev1.Phase{Name: phase.Init, Nanos: -5})
	b, err := proto.Marshal(&nodev1.Sandbox{Id: "x", Phases: wire, Runtime: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	var back nodev1.Sandbox
	if err := proto.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if got := phasesFromProto(back.GetPhases()); !reflect.DeepEqual(got, in) {
		t.Fatalf("phases %+v, want %+v", got, in)
	}
}
