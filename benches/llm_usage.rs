//! What reading a streamed LLM response's usage costs per byte: the usage
//! scanner (`tollgate::llm::usage::UsageScanner`) fed a stream of OpenAI
//! chat-completion chunks in pieces of the sizes a relay reads, beside one
//! SIMD search of the same bytes (`memchr::memmem`), the floor of anything
//! that looks at every byte. `bench/llm_stream.sh` measures the same stream
//! through a running gateway; this isolates the scanner's share of it.
//!
//! The stream is the bench script's: ~150-byte `data: {...}\n\n` chunks, a
//! few words of content each, ending with the usage chunk and `[DONE]`.
//! Every run checks that the scanner found that usage.
//!
//! Run: `cargo bench --bench llm_usage -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput};
use memchr::memmem;
use tollgate::llm::usage::{Format, UsageScanner};

/// About `bytes` of stream, whole events, the usage event last.
fn stream(bytes: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes + 512);
    let mut n = 0u64;
    while out.len() < bytes {
        out.extend_from_slice(
            format!(
                "data: {{\"id\":\"chatcmpl-9x\",\"object\":\"chat.completion.chunk\",\"created\":1733100000,\"model\":\"gpt-bench\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" token {n}\"}},\"finish_reason\":null}}]}}\n\n"
            )
            .as_bytes(),
        );
        n += 1;
    }
    out.extend_from_slice(
        format!(
            "data: {{\"id\":\"chatcmpl-9x\",\"object\":\"chat.completion.chunk\",\"created\":1733100000,\"model\":\"gpt-bench\",\"choices\":[],\"usage\":{{\"prompt_tokens\":12,\"completion_tokens\":{n},\"total_tokens\":{}}}}}\n\ndata: [DONE]\n\n",
            n + 12
        )
        .as_bytes(),
    );
    out
}

fn main() {
    let body = stream(4 << 20);
    let mut criterion = Criterion::default().configure_from_args();
    let mut group = criterion.benchmark_group("llm_usage");
    group.throughput(Throughput::Bytes(body.len() as u64));
    for chunk in [4096usize, 16384, 65536] {
        group.bench_with_input(BenchmarkId::new("scanner", chunk), &chunk, |b, &chunk| {
            b.iter(|| {
                let mut scanner = UsageScanner::new(Format::EventStream);
                for piece in body.chunks(chunk) {
                    scanner.feed(black_box(piece));
                }
                let usage = scanner.finish();
                assert!(usage.is_some(), "the usage event was found");
                usage
            })
        });
        let finder = memmem::Finder::new("usage");
        group.bench_with_input(
            BenchmarkId::new("one_search", chunk),
            &chunk,
            |b, &chunk| {
                b.iter(|| {
                    body.chunks(chunk)
                        .filter(|piece| finder.find(black_box(piece)).is_some())
                        .count()
                })
            },
        );
    }
    group.finish();
    criterion.final_summary();
}
