// Package bpfsizes holds the data plane's table sizes and bounds as Go
// constants, generated from the enums of the C headers (bpf/headers,
// bpf/syncookie_types.h) through the compiled objects' BTF (go generate,
// internal/loader/enumnames). It exists apart from internal/loader, which
// has the same values from bpf2go, because internal/policy is pure and
// must not import the loader (and with it cilium/ebpf and the embedded
// objects) to know, say, how many known_good prefixes the data plane holds.
package bpfsizes
