package policy

// CompileLists folds deny and allow entries into lists-trie records, as
// Compile does for the policy's own lists. The daemon uses it to merge
// entries added at run time (edgectl deny add, L7 escalation) with the
// policy's, without recompiling rules and ASN data.
func CompileLists(deny, allow []ListEntry) []ListRecord {
	return compileLists(deny, allow)
}
