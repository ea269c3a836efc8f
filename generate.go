// Package edgeguard is an edge flood limiter for Linux: an XDP data plane
// that drops volumetric floods at the NIC and an L7 stage for HTTP limits.
// The code lives under internal/ and cmd/; this file only holds the
// go:generate line that compiles the BPF program.
package edgeguard

// The BPF objects are committed so that `go build` needs no clang. CI
// regenerates them with the pinned clang and fails if they differ.
//go:generate go tool bpf2go -cc ${BPF_CLANG} -strip ${BPF_STRIP} -cflags ${BPF_CFLAGS} -target bpfel -go-package loader -output-dir internal/loader -type eg_action -type eg_reason -type eg_mode -type eg_clock -type eg_agg_mode -type eg_agg_kind -type eg_l4_dir -type eg_origin -type eg_global_slot -type eg_rule_action -type eg_sizes -type eg_sample -type eg_bucket_cfg -type eg_counter -type eg_prefix_val -type eg_standing -type eg_standing_why -type eg_class -type eg_class_agg -type eg_class_outcome -type eg_standing_event -type eg_shifts -type eg_l4_proto_bit -type eg_expiry -type eg_v4_mark -type eg_gate -type eg_sample_kind -type eg_fp_field -type eg_table_defaults Limiter bpf/xdp_limiter.c -- -I bpf/headers
// The names of the enums' values (metric labels, display words) come from
// the same C enumerators, read from the object's BTF.
//go:generate go run ./internal/loader/enumnames -o internal/loader/limiter_names.go -go-package loader -ident-prefix Limiter internal/loader/limiter_bpfel.o eg_action=EG_ACT_ eg_reason=EG_R_ eg_standing=EG_STANDING_ eg_standing_why=EG_WHY_ eg_class=EG_CLASS_ eg_class_agg=EG_CAGG_ eg_class_outcome=EG_CO_
// Sizes the policy checks against (it must not import the loader): from
// the same enums, into a package of constants alone.
//go:generate go run ./internal/loader/enumnames -values -o internal/bpfsizes/limiter.go -go-package bpfsizes internal/loader/limiter_bpfel.o eg_table_defaults=EG_TBL_
// The SYN path is its own object, loaded only on kernels that have what it
// needs (internal/loader/syn.go); the limiter loads without it.
//go:generate go tool bpf2go -cc ${BPF_CLANG} -strip ${BPF_STRIP} -cflags ${BPF_CFLAGS} -target bpfel -go-package loader -output-dir internal/loader -type eg_syn_mode -type eg_syn_counter -type eg_syn_sizes -type eg_syn_meta -type eg_syn_endpoint -type eg_syn_service -type eg_syn_state -type eg_syn_counters -type eg_syn_secret Syncookie bpf/syncookie.c -- -I bpf -I bpf/headers
//go:generate go run ./internal/loader/enumnames -values -o internal/bpfsizes/syncookie.go -go-package bpfsizes -ident-prefix Syn internal/loader/syncookie_bpfel.o eg_syn_sizes=EG_SYN_
