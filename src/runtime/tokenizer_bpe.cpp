// src/runtime/tokenizer_bpe.cpp — the BPE model: one pre-tokenized word → token ids.
//
// The word is split into characters (each looked up in the vocabulary, with the continuing-
// subword prefix / end-of-word suffix where configured; unknown characters become their
// <0xNN> byte tokens under byte_fallback, else the unk token, fused when fuse_unk), then
// merged: the adjacent pair with the lowest merge rank is merged first, leftmost on ties,
// until no adjacent pair has a merge. Symbols form a linked list over an array and candidate
// merges sit in a min-heap keyed by (rank, position); entries made stale by an earlier merge
// are recognised when popped (the pair at that position no longer yields the same id), so a
// word of n characters costs O(n log n). Results of words up to kCacheMaxWordBytes are cached.
#include <queue>

#include "runtime/tokenizer_impl.h"

namespace veloxquant::runtime::tok {

namespace {

struct Symbol {
  int32_t id;
  int prev, next;  // indices into the symbol array, -1 at the ends
  bool alive;
};

struct Candidate {
  int32_t rank;
  int pos;
  int32_t new_id;
  bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

void Bpe::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu);
    auto it = cache.find(std::string(word));
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  auto whole = ignore_merges ? vocab.find(std::string(word)) : vocab.end();
  if (whole != vocab.end()) {
    ids.push_back(whole->second);
  } else {
    // Characters → initial symbols.
    std::vector<Symbol> sym;
    sym.reserve(word.size());
    int32_t pending_unk = -1;  // fused unknown run not yet emitted (-1: none; ids are >= 0, and a plain
                               // int: GCC 12 warns -Wmaybe-uninitialized on an optional here)
    const auto add = [&](int32_t id) {
      const int n = static_cast<int>(sym.size());
      sym.push_back(Symbol{id, n - 1, -1, true});
      if (n > 0) sym[n - 1].next = n;
    };
    std::string key;
    size_t i = 0;
    bool first = true;
    while (i < word.size()) {
      const size_t b = i;
      const int len = utf8_valid_len(word, i);
      i += len > 0 ? static_cast<size_t>(len) : 1;
      const bool last = i >= word.size();
      key.clear();
      if (!first) key += continuing_subword_prefix;
      key.append(word.substr(b, i - b));
      if (last) key += end_of_word_suffix;
      first = false;
      auto it = vocab.find(key);
      if (it != vocab.end()) {
        if (pending_unk >= 0) {
          add(pending_unk);
          pending_unk = -1;
        }
        add(it->second);
        continue;
      }
      if (byte_fallback) {
        bool all = true;
        for (size_t k = b; k < i; ++k) all &= byte_ids[static_cast<unsigned char>(word[k])] >= 0;
        if (all) {
          for (size_t k = b; k < i; ++k) add(byte_ids[static_cast<unsigned char>(word[k])]);
          continue;
        }
      }
      if (unk_id) {
        if (pending_unk >= 0 && !fuse_unk) add(pending_unk);
        pending_unk = *unk_id;
      }
      // no unk token: the character is dropped, as in the reference
    }
    if (pending_unk >= 0) add(pending_unk);

    // Merges.
    const auto lookup = [&](int32_t a, int32_t b) -> const std::pair<int32_t, int32_t>* {
      auto it = merges.find((static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b));
      return it == merges.end() ? nullptr : &it->second;
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
    for (size_t k = 0; k + 1 < sym.size(); ++k)
      if (const auto* m = lookup(sym[k].id, sym[k + 1].id)) heap.push({m->first, static_cast<int>(k), m->second});
    while (!heap.empty()) {
      const Candidate top = heap.top();
      heap.pop();
      Symbol& cur = sym[top.pos];
      if (!cur.alive || cur.next < 0) continue;
      Symbol& right = sym[cur.next];
      const auto* m = lookup(cur.id, right.id);
      if (!m || m->second != top.new_id) continue;  // stale entry
      cur.id = top.new_id;
      right.alive = false;
      cur.next = right.next;
      if (right.next >= 0) sym[right.next].prev = top.pos;
      if (cur.prev >= 0)
        if (const auto* mp = lookup(sym[cur.prev].id, cur.id)) heap.push({mp->first, cur.prev, mp->second});
      if (cur.next >= 0)
        if (const auto* mn = lookup(cur.id, sym[cur.next].id)) heap.push({mn->first, top.pos, mn->second});
    }
    for (int k = sym.empty() ? -1 : 0; k >= 0; k = sym[k].next) ids.push_back(sym[k].id);
  }
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu);
    if (cache.size() >= kCacheCapacity) cache.clear();
    cache.emplace(std::string(word), std::move(ids));
  }
}

}  // namespace veloxquant::runtime::tok
