// A JSON value written for an error message, in bounded stack and time
// whatever its nesting.
//
// nlohmann's dump() (and its copy constructor) recurses once per level of
// nesting, so a value nested a few hundred thousand deep, as a hostile line
// of JSON Lines or a damaged spec file can hold, overflows the stack there
// although nlohmann's parser and destructor read and free it without
// recursion.  What names such a value in an error goes through here.
#ifndef RECFLOW_RECORDS_JSON_EXCERPT_H_
#define RECFLOW_RECORDS_JSON_EXCERPT_H_

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

namespace recflow::records {

// `value` as dump() writes it compactly (`[1,{"a":"x"}]`; a string's bytes
// that are not UTF-8 as U+FFFD), cut to its first `max_chars` bytes, then
// "..." when it is longer; the cut never splits a UTF-8 character.  Walks
// the containers with a stack of its own and stops writing at the cut: the
// time is bounded by `max_chars` and the depth reached, not the value's
// size.  Thread-safe (reads `value` only).
std::string JsonExcerpt(const nlohmann::json& value, size_t max_chars = 80);

}  // namespace recflow::records

#endif  // RECFLOW_RECORDS_JSON_EXCERPT_H_
