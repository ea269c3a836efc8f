package main

import (
	"net"
	"testing"

	"github.com/edgeguard/edgeguard/internal/testenv"
)

// TestRxClockCountsReceiveWork attaches the net_rx_action probe and sends
// datagrams over loopback, whose receive runs in the NET_RX softirq: the
// probe must see calls and time, and its sums only grow.
func TestRxClockCountsReceiveWork(t *testing.T) {
	testenv.RequireRoot(t)
	rc, err := newRxClock()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.close()
	before, err := rc.read()
	if err != nil {
		t.Fatal(err)
	}

	rx, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	tx, err := net.DialUDP("udp", nil, rx.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	buf := make([]byte, 64)
	for range 100 {
		if _, err := tx.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := rx.Read(buf); err != nil {
			t.Fatal(err)
		}
	}

	after, err := rc.read()
	if err != nil {
		t.Fatal(err)
	}
	if after.Calls <= before.Calls || after.NS <= before.NS {
		t.Fatalf("probe saw no receive work for 100 loopback datagrams: before %+v, after %+v", before, after)
	}
	t.Logf("100 datagrams: %d softirqs, %d ns in net_rx_action", after.Calls-before.Calls, after.NS-before.NS)
}
