#include "mesh/layout.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/error.h"

namespace loom::mesh {

namespace {

// Fine axis positions (outermost first), see Layout's private comment.
enum FineAxis : int { kPp = 0, kEdp = 1, kEp = 2, kCp = 3, kTp = 4 };

// Which fine axes a group varies over; all others are fixed to the rank's own.
std::array<bool, 5> varying_axes(Group g) {
  switch (g) {
    case Group::tp: return {false, false, false, false, true};
    case Group::cp: return {false, false, false, true, false};
    case Group::dp: return {false, true, true, false, false};
    case Group::pp: return {true, false, false, false, false};
    case Group::dp_cp: return {false, true, true, true, false};
    case Group::ep: return {false, false, true, false, false};
    case Group::expert_dp: return {false, true, false, false, false};
    case Group::expert_dp_cp: return {false, true, false, true, false};
  }
  LOOM_CHECK(false, "unknown group ", static_cast<int>(g));
}

}  // namespace

std::string MeshShape::str() const {
  return concat("pp=", pp, " dp=", dp, " cp=", cp, " tp=", tp, " ep=", ep);
}

void validate_shape(const MeshShape& s, int world_size) {
  LOOM_REQUIRE(world_size >= 1, "parallel: the world size is ", world_size, ", must be >= 1");
  const std::pair<const char*, int> extents[] = {
      {"pp", s.pp}, {"dp", s.dp}, {"cp", s.cp}, {"tp", s.tp}, {"ep", s.ep}};
  for (const auto& [key, value] : extents)
    LOOM_REQUIRE(value >= 1, "parallel.", key, " = ", value, " is invalid: must be >= 1");
  // Saturating, so absurd extents still give an exact message, not overflow.
  int64_t product = 1;
  for (int value : {s.pp, s.dp, s.cp, s.tp})
    product = static_cast<int64_t>(std::min<__int128>(__int128{product} * value, INT64_MAX));
  const std::string shown = product == INT64_MAX ? "(too large)" : std::to_string(product);
  LOOM_REQUIRE(product == world_size, "parallel: pp*dp*cp*tp = ", s.pp, "*", s.dp, "*", s.cp,
               "*", s.tp, " = ", shown, " does not equal the world size ", world_size);
  LOOM_REQUIRE(s.dp % s.ep == 0, "parallel.ep = ", s.ep, " must divide parallel.dp = ", s.dp,
               " (expert parallelism splits the data-parallel axis)");
}

std::string_view group_name(Group g) {
  switch (g) {
    case Group::tp: return "tp";
    case Group::cp: return "cp";
    case Group::dp: return "dp";
    case Group::pp: return "pp";
    case Group::dp_cp: return "dp_cp";
    case Group::ep: return "ep";
    case Group::expert_dp: return "expert_dp";
    case Group::expert_dp_cp: return "expert_dp_cp";
  }
  LOOM_CHECK(false, "unknown group ", static_cast<int>(g));
}

Layout::Layout(const MeshShape& shape, int world_size) : shape_(shape), world_size_(world_size) {
  validate_shape(shape, world_size);
}

Layout::Fine Layout::fine_extents() const {
  return {shape_.pp, shape_.dp / shape_.ep, shape_.ep, shape_.cp, shape_.tp};
}

void Layout::check_rank(int rank) const {
  LOOM_CHECK(rank >= 0 && rank < world_size_, "rank ", rank, " outside the world of ",
             world_size_, " (", shape_.str(), ")");
}

Layout::Fine Layout::fine_coord(int rank) const {
  check_rank(rank);
  const Fine ext = fine_extents();
  Fine c{};
  for (int a = kFineAxes - 1; a >= 0; --a) {
    c[a] = rank % ext[a];
    rank /= ext[a];
  }
  return c;
}

int Layout::fine_rank(const Fine& c) const {
  const Fine ext = fine_extents();
  int rank = 0;
  for (int a = 0; a < kFineAxes; ++a) {
    LOOM_CHECK(c[a] >= 0 && c[a] < ext[a], "coordinate ", c[a], " outside the extent ", ext[a],
               " of fine axis ", a, " (", shape_.str(), ")");
    rank = rank * ext[a] + c[a];
  }
  return rank;
}

Coord Layout::coord(int rank) const {
  const Fine f = fine_coord(rank);
  return Coord{.pp = f[kPp],
               .dp = f[kEdp] * shape_.ep + f[kEp],
               .cp = f[kCp],
               .tp = f[kTp],
               .ep = f[kEp],
               .expert_dp = f[kEdp]};
}

int Layout::rank_of(const Coord& c) const {
  LOOM_CHECK(c.dp >= 0 && c.dp < shape_.dp, "dp coordinate ", c.dp, " outside ", shape_.str());
  return fine_rank({c.pp, c.dp / shape_.ep, c.dp % shape_.ep, c.cp, c.tp});
}

int Layout::group_size(Group g) const {
  const auto vary = varying_axes(g);
  const Fine ext = fine_extents();
  int size = 1;
  for (int a = 0; a < kFineAxes; ++a)
    if (vary[a]) size *= ext[a];
  return size;
}

// Enumerates the varying axes as a mixed-radix counter, outermost axis most
// significant: since the world rank is increasing in every fine coordinate
// with the same significance order, the members come out ascending.
std::vector<int> Layout::group_ranks(Group g, int rank) const {
  const auto vary = varying_axes(g);
  const Fine ext = fine_extents();
  Fine c = fine_coord(rank);
  for (int a = 0; a < kFineAxes; ++a)
    if (vary[a]) c[a] = 0;
  std::vector<int> ranks;
  ranks.reserve(group_size(g));
  for (;;) {
    ranks.push_back(fine_rank(c));
    int a = kFineAxes - 1;
    for (; a >= 0; --a) {
      if (!vary[a]) continue;
      if (++c[a] < ext[a]) break;
      c[a] = 0;
    }
    if (a < 0) return ranks;
  }
}

int Layout::group_rank(Group g, int rank) const {
  const auto vary = varying_axes(g);
  const Fine ext = fine_extents();
  const Fine c = fine_coord(rank);
  int index = 0;
  for (int a = 0; a < kFineAxes; ++a)
    if (vary[a]) index = index * ext[a] + c[a];
  return index;
}

int Layout::group_index(Group g, int rank) const {
  const auto vary = varying_axes(g);
  const Fine ext = fine_extents();
  const Fine c = fine_coord(rank);
  int index = 0;
  for (int a = 0; a < kFineAxes; ++a)
    if (!vary[a]) index = index * ext[a] + c[a];
  return index;
}

int Layout::pp_prev(int rank) const {
  Fine c = fine_coord(rank);
  c[kPp] = (c[kPp] + shape_.pp - 1) % shape_.pp;
  return fine_rank(c);
}

int Layout::pp_next(int rank) const {
  Fine c = fine_coord(rank);
  c[kPp] = (c[kPp] + 1) % shape_.pp;
  return fine_rank(c);
}

}  // namespace loom::mesh
