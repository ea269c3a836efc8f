// Package asn loads IP→ASN/country data (iptoasn TSV, MaxMind DB) into
// minimal, sorted CIDR tables that the policy compiler and the CLI consume.
package asn

import "net/netip"

// Entry maps one CIDR to the ASN and country that announce it.
type Entry struct {
	Prefix  netip.Prefix
	ASN     uint32
	Country [2]byte // ISO 3166 alpha-2, zero if unknown
}
