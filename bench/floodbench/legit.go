package main

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgeguard/edgeguard/internal/testbed"
)

// echoServer answers every datagram on conn with the same bytes until conn
// closes, and counts what it read.
func echoServer(conn *net.UDPConn, served *atomic.Uint64) {
	buf := make([]byte, 2048)
	for {
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		served.Add(1)
		conn.WriteToUDPAddrPort(buf[:n], from)
	}
}

// legitResult is what the legit clients saw.
type legitResult struct{ sent, answered uint64 }

// runLegit makes each client send rate requests/s to server for d, each
// request a sequence number, and counts the distinct answers that arrive
// by d + 1s. The sockets are made in the client namespace.
func runLegit(ns *testbed.Namespace, clients []netip.Addr, server netip.AddrPort, rate int, d time.Duration) (legitResult, error) {
	var res legitResult
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, len(clients))
	var conns []*net.UDPConn
	var counts []*atomic.Uint64
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i, a := range clients {
		var c *net.UDPConn
		err := ns.Do(func() (err error) {
			c, err = net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, 0)), net.UDPAddrFromAddrPort(server))
			return err
		})
		if err != nil {
			// Stop the clients already started, then report.
			for _, c := range conns {
				c.Close()
			}
			wg.Wait()
			return res, err
		}
		n := int(d.Seconds() * float64(rate))
		wg.Add(2)
		seen := make([]bool, n)
		answered := new(atomic.Uint64)
		go func() { // receiver
			defer wg.Done()
			buf := make([]byte, 64)
			c.SetReadDeadline(time.Now().Add(d + time.Second))
			for {
				k, err := c.Read(buf)
				if err != nil {
					return
				}
				if k >= 8 {
					s := binary.BigEndian.Uint64(buf)
					if s < uint64(n) && !seen[s] {
						seen[s] = true
						answered.Add(1)
					}
				}
			}
		}()
		go func() { // sender, paced
			defer wg.Done()
			start := time.Now()
			buf := make([]byte, 32)
			var sent uint64
			for s := 0; s < n; s++ {
				time.Sleep(time.Until(start.Add(time.Duration(s) * time.Second / time.Duration(rate))))
				binary.BigEndian.PutUint64(buf, uint64(s))
				if _, err := c.Write(buf); err != nil {
					errs[i] = err
					break
				}
				sent++
			}
			mu.Lock()
			res.sent += sent
			mu.Unlock()
		}()
		conns = append(conns, c)
		counts = append(counts, answered)
	}
	wg.Wait()
	for i, c := range conns {
		c.Close()
		res.answered += counts[i].Load()
	}
	return res, errors.Join(errs...)
}
