// The fused batch-parse path: tf.data's map_and_batch fusion, taken down
// through the shuffle and the reading below it.
//
// For Parse(Batch(S1(S2(...(FromTFRecords))))) with each S a Shuffle, a
// Repeat, a Take, a Skip or a Shard, the stages run as one, so that
// per-record work is on every core.
// The chain may end in a SampleFromDatasets or a ChooseFromDatasets
// instead of the source, each of whose inputs is such a chain
// (SampleStream, ChooseStream; the files of all its sources are read by
// reader tasks alike, each source with its options):
//
//   reader tasks (one per open file, in the arena, kChunksAhead ahead;
//     smaller chunks when many files are open at once):
//     read blocks, check frames and CRCs ──▶ chunks of record views
//   planner (the consumer's thread, in GetNext; SetPlanInTask(1): a task
//     of its own): interleave files ──▶
//     shuffle ──▶ repeat ──▶ batch, over refs to the views (RecordRef: a
//     view stays in the chunk its reader wrote; never record bytes),
//     kBatchesAhead batches per parse call ahead
//   parse tasks (parse's num_parallel_calls at once, in the arena):
//     take a batch's views out of their chunks and parse them straight
//     into its tensors; the consumer
//     parses the one it needs if no task took it yet, and while it waits
//     (for that one, or for a reader task that is mid-chunk) a queued one
//     that no free task would reach (QueuedPastFreeTasks)
//   consumer: takes the batches in planned order
//
// With one parse call there are no parse tasks: the consumer's thread
// plans and parses, as an unfused pipeline of one call runs.  It reads
// too, unless files are read in parallel (num_parallel_reads > 1): then
// reader tasks read ahead, as the unfused source's reader threads do.
//
// A global shuffle (uncompressed, indexed files; alone, or as inputs of a
// mixture) has no reader tasks: the planner takes the permutation's next
// records from the indexes unread, and each parse call first reads its
// batch's records of each global shuffle, all at once (ReadRanges),
// checking their frames.  A damaged record then fails the batch it was
// planned into, where the stages would deliver the batch's other records
// in the next one; every other error keeps its place.
//
// The planner runs the same algorithms with the same seeds as the stages
// it replaces (the TFRecord interleave, TensorFlow's buffered shuffle,
// Repeat's per-epoch salts, Batch's remainder rule), so the elements and
// their order are those of the unfused pipeline, whatever the thread
// count; only where the work runs changes.  Errors keep their place: a
// reader stops its file at a damaged record and the planner throws that
// error when it reaches the record, as the source would; a bad Example
// fails its batch.
//
// Memory: reader tasks hold at most kChunksAhead chunks per open file (and
// per file opened ahead: the next one of an interleave, and the first of
// each epoch a Repeat makes ahead, EpochsPrepared where they are short);
// the shuffle buffers hold refs to views, which keep their chunks (72
// bytes a record, and the read blocks the chunk's views view: views hold
// no block of their own, FileRecords::KeepBlocksIn) until each of the
// chunk's records' batches is taken (ViewLedger).  A view still buffered
// after kCompactAfter buffer lengths of input (a fraction e^-3, 5%, of
// records under TensorFlow's shuffle) is copied into a small shared chunk
// (kCompactedChunkBytes) and its ref moved to a chunk of the shuffle's
// own, so that it stops holding its reader's chunk; so the blocks held
// span at most about three buffers' worth of records, and those chunks
// about a quarter of a buffer's bytes.  Batches in flight: kBatchesAhead x
// calls.
//
// The saved state (stage "batch_parse") holds the finished batches not yet
// taken, the planner's pending records, and each fused stage's position:
// files, offsets and record indexes; shuffle generators and buffers (records
// from uncompressed files by reference, as Shuffle saves them); epochs.
#include <fmt/format.h>
#include <sys/stat.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "pipeline/stages.h"
#include "records/compression.h"
#include "records/index.h"

namespace recflow::pipeline::stages {
namespace {

// Records one reader task reads at once (or fewer, to at most
// kChunkBytes): 100-300 µs of work, so a task is worth its scheduling.
constexpr size_t kChunkRecords = 512;
constexpr uint64_t kChunkBytes = uint64_t{1} << 20;
// Chunks a file's reader keeps ready ahead of the planner.  One file read
// at a time on 2 threads, the reader task (~130 ns a record) shares the
// cores with parsing and the planner, and runs in bursts: with 2 chunks
// ahead the planner waited for it ~20% of the time, shuffled (10,000)
// 3.96-4.43 M records/s; with 4, 4.54-4.59 M (8: 4.38-4.43 M).
constexpr size_t kChunksAhead = 4;
// With many files read at once, each file's chunks are smaller, so that
// the records read ahead of all open files together stay about what one
// file reads ahead with full chunks: a record is parsed while the kernel's
// copy of it is still in cache.  (Fashion-MNIST, 16 files at once, 2
// threads: 3.5 M records/s with full chunks, 4.1-4.3 M with 128-record
// ones, as fast as one file at a time; docs/PERFORMANCE.md.)
constexpr size_t kReadAheadRecords = 2048;
constexpr size_t kMinChunkRecords = 128;
size_t ChunkRecords(int64_t files_at_once) {
  const auto files = static_cast<size_t>(std::max<int64_t>(files_at_once, 1));
  return std::clamp(kReadAheadRecords / files, kMinChunkRecords, kChunkRecords);
}
uint64_t ChunkBytes(size_t chunk_records) {
  return kChunkBytes / kChunkRecords * chunk_records;
}
// At one thread no task reads ahead: the planner reads each chunk itself
// when its turn comes, and the batch's parse reads the records next.  A
// chunk of at most one read block keeps them in cache from the kernel's
// copy and the CRCs to the parse (on an Intel Xeon, the CPU of the 16-core
// machines: the MNIST fixture's 3.2 KB records 1.04 -> 1.18 M records/s,
// Fashion-MNIST read one file at a time 2.37 -> 2.51 M, parse-only; the
// shuffled ones within the noise; docs/PERFORMANCE.md).
constexpr uint64_t kOneThreadChunkBytes = uint64_t{128} << 10;
// Epochs whose inputs a Repeat makes (and whose readers start) ahead of
// the open one where epochs are short (at most kShortEpochRecords, what
// one reader reads ahead: a file of such an epoch is read whole at once).
// Under a shuffle whose buffer holds such an epoch, the epoch drains from
// its start, and meanwhile the planner fills the next epoch's buffer from
// that epoch's reader (RepeatEpochs::Handed).  Made only one epoch ahead,
// that reader was made when the epoch before opened, tens of µs earlier:
// its task had not started, and the planner read a quarter of the chunks
// itself and waited for the rest, one file read at a time.  Two epochs
// ahead, a reader starts an epoch before its records are drawn (the MNIST
// fixture, 1,000 records a file, shuffled at 2 threads: 1.30x -> 1.55x
// one thread's rate; three: no better; docs/PERFORMANCE.md).  Longer
// epochs give a reader an epoch's planning ahead already; made two ahead
// there, a file read by ranges read max(4, threads) ranges an epoch early
// into blocks that were cold by their turn (Fashion-MNIST as one 52 MB
// file, shuffled at 16 threads on this VM: ~10% slower, +25 MiB).
// How many short epochs ahead: as many as the arena has threads, no more
// than the machine has cores, from 2 to 8.  A short epoch's reader has at
// most its file's chunks to read (2 for the fixture), so on 16 cores two
// epochs ahead kept ~4 workers reading: the fixture shuffled at 16 threads
// made 2.5-3.1x one thread's rate, and 7.2-9.4x with 8 epochs ahead (H200
// machine, 16 cores; 16 ahead: 8% more, not taken).  Where the workers
// share few cores, 8 ahead were slower: on 2 vCPUs at 2 threads 1.15-1.21x
// against 1.50-1.56x, at 16 threads ~17% slower; the far epochs' readers
// held the cores while the planner read the near epoch itself.  Each
// prepared reader holds at most kChunksAhead chunks (4 MiB) and its
// file's read-ahead: 8 ahead cost the fixture's pipeline at 16 threads
// 60-95 MiB more peak RSS (docs/PERFORMANCE.md).
constexpr size_t kMinEpochsPrepared = 2;
constexpr size_t kMaxEpochsPrepared = 8;
// The cores the fused path counts (SetFusedCores; 0: the machine's).
std::atomic<int> fused_cores{0};
size_t FusedCores() {
  const int set = fused_cores.load(std::memory_order_relaxed);
  return static_cast<size_t>(set > 0 ? set : MachineCores());
}
int EpochsPrepared(size_t threads) {
  return static_cast<int>(std::clamp(std::min(threads, FusedCores()),
                                     kMinEpochsPrepared, kMaxEpochsPrepared));
}
constexpr uint64_t kShortEpochRecords = kChunksAhead * kChunkRecords;
// Batches planned ahead of the consumer, per parse call.
constexpr size_t kBatchesAhead = 2;
// The planner runs on the consumer's thread unless SetPlanInTask(1) puts
// it in a task of its own (KickPlannerLocked), which keeps the batches
// ahead planned while the consumer is away.  From 8 threads on 8 cores
// that was the default (dcae4aa: on 16 cores the consumer's thread was
// the shuffled pipeline's bound, ~10-12 of its ~18-21 us a batch
// planning), until two 16-core machines measured it (2026-11-28,
// pipeline_bench's FusedPlanner, repetitions interleaved at random,
// docs/PERFORMANCE.md): the task made 0.80-0.97x the records/s of the
// consumer's thread shuffled at 8 and 16 threads, 0.91-0.98x parse-only,
// and 0.77-0.90x at 4.  One thread plans either way, and the task's
// hand-offs cost more than the consumer's thread freed.  On 2
// vCPUs the task made 0.88-0.91x at 4 threads and 0.99-1.02x at 16, with
// ~20 MiB more peak RSS (the planner's allocations then in every worker's
// malloc arena).
std::atomic<int> plan_in_task{-1};  // SetPlanInTask: -1 the default (0)
bool PlanInTask(int calls) {
  return calls > 1 && plan_in_task.load(std::memory_order_relaxed) == 1;
}
// Workers for the fused stage's tasks (its own arena).  Where the
// consumer's thread plans (and parses the batch due when no task has taken
// it), it is busy most of the time, so where `threads` workers would take
// every core, one worker fewer leaves it a core: the threads that work are
// `threads`, as at one thread (the consumer's alone).  On 2 vCPUs at 2
// threads, the consumer and two workers took turns on the cores
// (preempted ~3 times a batch; the consumer's thread on a core 72% of the
// time): the MNIST fixture shuffled made 4.40 M records/s with two
// workers and 4.63 M with one (medians of 8 alternating rounds; 1.59x ->
// 1.70x one thread's rate), Fashion-MNIST the same (docs/PERFORMANCE.md).  With
// the planner in a task of its own, the consumer only takes batches: every
// thread a worker.  With fewer threads than cores, the consumer has a core of
// its own anyway.  With one parse call the consumer's thread plans and
// parses every batch, and its tasks (where there are any) read ahead: the
// same rule.  Fashion-MNIST as 4 shards read 2 at once, 2 threads, 8
// alternating runs: one worker made 439-478k records/s gzipped against
// 386-457k with two, and 3.42-4.65M uncompressed against 1.48-4.38M.
int FusedWorkers(int threads, bool plan_in_task) {
  if (plan_in_task) return threads;
  if (static_cast<size_t>(threads) < FusedCores()) return threads;
  return std::max(1, threads - 1);
}
// The last fused stage's workers (LastFusedWorkers, for tests).
std::atomic<int> last_fused_workers{0};
// Tasks of the fused path running now, and the most at once since
// TakeFusedTasksAtOnceMost last asked (for tests: the workers' count).
std::atomic<int> tasks_running{0};
std::atomic<int> tasks_running_most{0};
struct TaskRunning {
  TaskRunning() {
    const int now = tasks_running.fetch_add(1, std::memory_order_relaxed) + 1;
    int most = tasks_running_most.load(std::memory_order_relaxed);
    while (now > most && !tasks_running_most.compare_exchange_weak(
                             most, now, std::memory_order_relaxed)) {
    }
  }
  ~TaskRunning() { tasks_running.fetch_sub(1, std::memory_order_relaxed); }
  TaskRunning(const TaskRunning&) = delete;
  TaskRunning& operator=(const TaskRunning&) = delete;
};
// Chunks the planner read for another file while it waited (HelpRead), in
// this process (for tests).
std::atomic<uint64_t> planner_help_reads{0};
// More finished batches than any state holds (kBatchesAhead per call, for
// more calls than any machine has threads): a bound on forged states.
constexpr uint64_t kMaxSavedBatches = kBatchesAhead * 65536 + 1;
class RangeIndexes;

// Records handed on by reference.  The planner moves 16-byte refs through
// the shuffle buffer and into batches, never the 72-byte views themselves:
// a view stays where its reader task wrote it (a chunk) until the parse
// task that parses it reads it there.  On 16 cores the planner, moving
// views out of chunks other cores wrote, was the one thread every shuffled
// pipeline waited for (the "batch" stage 76% busy from 4 threads on,
// docs/PERFORMANCE.md); refs leave those cache misses to the parse tasks,
// which run on every core.
struct ViewChunk {
  std::vector<RecordView> views;
  // The read blocks that its views view: a reader's views hold none of
  // their own (FileRecords::KeepBlocksIn), so the blocks go with the chunk.
  std::vector<std::shared_ptr<const void>> blocks;
  uint64_t refs = 0;          // refs to views handed out and not retired
  bool open = true;           // its producer may still hand out refs to it
  ViewChunk* prev = nullptr;  // in ViewLedger's list
  ViewChunk* next = nullptr;
};
struct RecordRef {
  RecordView* view = nullptr;
  ViewChunk* chunk = nullptr;
};

// Owns every ViewChunk of one fused iterator; a chunk goes once its
// producer closed it and every ref to it was retired (the batch that holds
// the ref was taken by the consumer, who takes batches in order, so every
// parse task that read the chunk is done).  Planner's thread only, which
// is also the consumer's; parse tasks read and clear views through refs
// but never touch the ledger, except FreeDiscarded.
//
// Freeing a chunk reads each of its views (their owners), which parse
// tasks on other cores wrote when they moved the views out: a cache line
// from another core per record, on the one thread every batch waits for.
// With Discard(true) the ledger leaves freeing to whoever calls
// FreeDiscarded (the parse tasks, which have cores to spare), and the
// planner only queues the chunk.
class ViewLedger {
 public:
  ViewLedger() = default;
  ViewLedger(const ViewLedger&) = delete;
  ViewLedger& operator=(const ViewLedger&) = delete;
  ~ViewLedger() {
    while (head_ != nullptr) Unlink(head_);
    FreeDiscarded();
  }
  // Whether chunks done with are queued for FreeDiscarded (true) or freed
  // at once (false, the default).  Before the first chunk.
  void Discard(bool queue) { queue_discarded_ = queue; }
  // Frees the chunks queued so far.  Any thread.
  void FreeDiscarded() {
    std::vector<ViewChunk*> chunks;
    {
      std::lock_guard<std::mutex> lock(discarded_mu_);
      if (discarded_.empty()) return;
      chunks.swap(discarded_);
    }
    for (ViewChunk* c : chunks) delete c;
  }
  ViewChunk* Adopt(std::vector<RecordView>&& views,
                   std::vector<std::shared_ptr<const void>>&& blocks = {}) {
    auto* c = new ViewChunk;
    c->views = std::move(views);
    c->blocks = std::move(blocks);
    c->next = head_;
    if (head_ != nullptr) head_->prev = c;
    head_ = c;
    return c;
  }
  // A ref to c->views[i].
  static RecordRef Ref(ViewChunk* c, size_t i) {
    ++c->refs;
    return {&c->views[i], c};
  }
  // The producer hands out no more refs to `c`.
  void Close(ViewChunk* c) {
    c->open = false;
    if (c->refs == 0) Unlink(c);
  }
  void Retire(const RecordRef& r) {
    if (--r.chunk->refs == 0 && !r.chunk->open) Unlink(r.chunk);
  }
  void Retire(std::span<const RecordRef> refs) {
    for (const RecordRef& r : refs) Retire(r);
  }
  // Views of the caller's own (restored from a state): refs to them, in
  // order.
  void AdoptLoose(std::vector<RecordView>&& views,
                  std::vector<RecordRef>* out) {
    ViewChunk* c = Adopt(std::move(views));
    for (size_t i = 0; i < c->views.size(); ++i) out->push_back(Ref(c, i));
    Close(c);
  }

 private:
  void Unlink(ViewChunk* c) {
    if (c->prev != nullptr) c->prev->next = c->next;
    if (c->next != nullptr) c->next->prev = c->prev;
    if (head_ == c) head_ = c->next;
    if (!queue_discarded_) {
      delete c;
      return;
    }
    // Its blocks go now (a few a chunk), so that the chunks queued hold
    // only their views.
    c->blocks.clear();
    {
      std::lock_guard<std::mutex> lock(discarded_mu_);
      discarded_.push_back(c);
      if (discarded_.size() < kMaxDiscarded) return;
    }
    // No parse task came by for that long (the consumer parsed every
    // batch itself): the planner frees them, so that they stay bounded.
    FreeDiscarded();
  }
  static constexpr size_t kMaxDiscarded = 64;
  ViewChunk* head_ = nullptr;
  bool queue_discarded_ = false;
  std::mutex discarded_mu_;
  std::vector<ViewChunk*> discarded_;  // unlinked, not yet freed
};

class FileReader;

// One TFRecord source of the fused stages (a mixture has several): its
// options, where its files start in Env::paths, and its stage's counter.
struct FileSource {
  const TFRecordOptions* options = nullptr;
  size_t first_file = 0;
  StageCounter* counter = nullptr;
};

// One global shuffle of the fused stages (a mixture may have several, and
// TFRecord sources beside them): its files, where they start in
// Env::paths, its stage's counter (its reads), and the parse calls'
// reader of its records.
struct GlobalFiles {
  const GlobalShuffleSource* source = nullptr;
  size_t first_file = 0;
  StageCounter* counter = nullptr;
  std::unique_ptr<UnreadFiles> unread;
};

// What the parts of one fused iterator share.
struct Env {
  IteratorContext* ctx;
  // The files of every source, each source's in its own order (a source
  // listed twice in a mixture, once); records name them by index here.
  const std::vector<std::shared_ptr<const std::string>>* paths;
  // The TFRecord sources, by stage.
  std::map<const DatasetBase*, FileSource> sources;
  // The global shuffles, by stage.
  std::map<const DatasetBase*, GlobalFiles> globals;
  // The planner's ("batch"): the streams' work that no stage of its own
  // counts (a shuffle counts its own draws, ShuffleStream).
  StageCounter* plan_counter = nullptr;
  // Reader tasks read ahead; false: the planner reads, on its own thread.
  bool read_ahead = true;
  // Where files with an index are read by ranges on several threads at
  // once (FileReader); null: every file in one piece.
  RangeIndexes* ranges = nullptr;
  size_t threads = 1;  // of the iterator's arena (IteratorOptions::threads)
  // Where the fused stage's tasks run (FusedWorkers).
  tbb::task_arena* arena = nullptr;
  // A reader's chunks: at most so many records and bytes (ChunkRecords).
  size_t chunk_records = kChunkRecords;
  uint64_t chunk_bytes = kChunkBytes;
  // Set while a state is saved: reader tasks stop after their chunk.
  std::atomic<bool> paused{false};
  ViewLedger ledger;  // the planner's

  // Work for the planner while a reader task it needs is mid-chunk: parses
  // one queued batch and returns true, or false when none is queued.  Set
  // when there are parse tasks (else empty).  Called with no lock held.
  std::function<bool()> help;
  // Where the planner, with no batch to parse, reads another file's next
  // chunk instead of waiting (FileReader::HelpRead): when it plans on the
  // consumer's thread.  (The MNIST fixture shuffled at 2 threads on 2
  // vCPUs: the planner waited for a reader 7% of the run, then ~1%; +3-7%
  // records/s, docs/PERFORMANCE.md.)  Where it plans in a task of its own
  // (SetPlanInTask(1)) it is the bound, and a chunk read for later would
  // only delay it.  The readers alive, oldest first (the planner's:
  // readers are made and dropped where it plans).
  bool help_read = false;
  std::vector<FileReader*> readers;

  // Reader tasks enqueued and not yet ended, of readers alive or gone (a
  // reader does not wait for its queued tasks; see FileReader's
  // destructor): the fused stage waits for none left before the Env goes.
  void ReaderTaskQueued() {
    std::lock_guard<std::mutex> lock(reader_tasks_mu);
    ++reader_tasks;
  }
  void ReaderTaskEnded() {
    std::lock_guard<std::mutex> lock(reader_tasks_mu);
    if (--reader_tasks == 0) reader_tasks_cv.notify_all();
  }
  void WaitForNoReaderTasks() {
    std::unique_lock<std::mutex> lock(reader_tasks_mu);
    reader_tasks_cv.wait(lock, [this] { return reader_tasks == 0; });
  }
  std::mutex reader_tasks_mu;
  std::condition_variable reader_tasks_cv;
  int64_t reader_tasks = 0;

  // *paths, shared by the batches' origins (whose rows name files by
  // FileId), so that a batch holds its file names with one count.
  std::shared_ptr<const BatchOrigins::Files> origin_files;

  uint64_t FileId(const RecordView& v) const {
    return static_cast<uint64_t>(v.path - paths->data());
  }
  const FileSource& Source(const DatasetBase* stage) const {
    return sources.at(stage);
  }
  // The global shuffle whose files hold file `id` of *paths; null where a
  // TFRecord source's do.
  const GlobalFiles* GlobalOf(uint64_t id) const {
    for (const auto& [stage, g] : globals) {
      if (id >= g.first_file && id - g.first_file < g.source->paths.size()) {
        return &g;
      }
    }
    return nullptr;
  }
};

// Record `index` of file `file` of global shuffle `g`, planned but not
// read.
RecordView UnreadView(const Env& env, const GlobalFiles& g, size_t file,
                      uint64_t index) {
  const records::IndexEntry& e = g.source->indexes[file]->entries[index];
  RecordView v;
  v.unread = true;
  v.path = &(*env.paths)[g.first_file + file];
  v.offset = e.offset;
  v.index = index;
  v.size = e.size;
  return v;
}

// A saved record: by reference when its bytes are the frame at its origin
// (WriteRecordReference), else whole, with its origin.
void WriteView(StateWriter* w, const Env& env, const RecordView& v) {
  if (v.unread) {  // where the index puts it
    w->U64(2);
    w->U64(env.FileId(v));
    w->U64(v.offset);
    w->U64(v.index);
    return;
  }
  if (v.frame_crc) {
    WriteRecordReference(w, env.FileId(v), v.offset, v.index, v.bytes());
    return;
  }
  w->U64(0);
  w->U64(env.FileId(v));
  w->U64(v.offset);
  w->U64(v.index);
  w->String(v.bytes());
}

RecordView ReadView(StateReader* r, const Env& env, ReferenceReader* refs) {
  const uint64_t kind = r->U64();
  if (kind > 2) r->Fail("unknown record kind");
  const uint64_t file = r->U64();
  if (file >= env.paths->size()) r->Fail("file out of range");
  const auto& path = (*env.paths)[file];
  const uint64_t offset = r->U64();
  const uint64_t index = r->U64();
  if (kind == 2) {
    const GlobalFiles* g = env.GlobalOf(file);
    if (g == nullptr) r->Fail("an unread record in a file stream");
    const size_t local = file - g->first_file;
    const auto& entries = g->source->indexes[local]->entries;
    if (index >= entries.size() || entries[index].offset != offset) {
      r->Fail(fmt::format("no record {} at byte {} in the index of {}", index,
                          offset, *path));
    }
    return UnreadView(env, *g, local, index);
  }
  if (kind == 1) {
    return refs->Read(path, offset, index, static_cast<uint32_t>(r->U64()));
  }
  RecordView v;
  OwnBytes(&v, r->String());
  v.path = &path;
  v.offset = offset;
  v.index = index;
  return v;
}

// Where a file's ranges start: (offset, record) of each range's first
// record, in file order, every `range_bytes` or more of the file, and last
// the end of the last indexed record (offset, record count).
using RangeStarts = std::vector<std::pair<uint64_t, uint64_t>>;

// Files smaller than this are read in one piece, index or not.  A reader
// keeps a few MiB of its file ready ahead, and the next file's reader,
// opened with it, reads beside it: a file of a few MiB is read by two
// tasks already, and ranges only added readers that read further ahead
// and took the cores from parsing (16 Fashion-MNIST shards of 3.3 MB,
// parse-only, 2 threads, 6 alternating rounds: 3.1-4.8 M records/s with
// ranges against 2.7-5.1 M without, slower in 5 of 6; docs/PERFORMANCE.md).
// A large file has one reader for most of its length.
constexpr uint64_t kMinRangedFileBytes = uint64_t{16} << 20;
std::atomic<uint64_t> min_file_bytes{kMinRangedFileBytes};

// The range starts of the files read by ranges, from their indexes, kept
// small (16 bytes a range, not the index's 32 a record) and kept for the
// process: iterators come and go (one per epoch in a Python `for` loop,
// the Estimator's train and evaluate calls), and reading an index again
// each time cost ~170 us for 3,840 records, on the planner's thread (2.7 ms
// for 16 Fashion-MNIST shards, an eighth of an epoch on two threads).  An
// entry is read again when the file's size or the index's size or time
// changes.  An index is used only where it can be: an uncompressed file
// with a plain index at path.idx (records::IndexPathFor) that is well
// formed and lies within the file as it is now.  It is never trusted
// further: where its ranges start is checked against the records read
// before them (FileReader), so a stale entry costs speed, never records.
// A file without one is read from start to end, as always.
// Thread-safe.
class RangeIndexes {
 public:
  std::shared_ptr<const RangeStarts> Get(const std::string& path,
                                         const TFRecordOptions& options,
                                         uint64_t range_bytes) {
    if (options.compression &&
        *options.compression != records::Compression::kNone) {
      return nullptr;
    }
    struct stat file, index;
    if (::stat(path.c_str(), &file) != 0) return nullptr;  // the reader says
    if (static_cast<uint64_t>(file.st_size) <
        min_file_bytes.load(std::memory_order_relaxed)) {
      return nullptr;
    }
    const std::string index_path = records::IndexPathFor(path);
    if (::stat(index_path.c_str(), &index) != 0) return nullptr;
    Key key{path, range_bytes};
    Stamp stamp{static_cast<uint64_t>(file.st_size),
                static_cast<uint64_t>(index.st_size),
                static_cast<int64_t>(index.st_mtim.tv_sec) * 1000000000 +
                    index.st_mtim.tv_nsec,
                !options.compression};
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto it = entries_.find(key);
      if (it != entries_.end() && it->second.stamp == stamp) {
        return it->second.starts;
      }
    }
    // Read without the lock: other iterators' files go on meanwhile.
    std::shared_ptr<const RangeStarts> starts =
        Load(path, index_path, stamp, range_bytes);
    std::lock_guard<std::mutex> lock(mu_);
    if (entries_.size() >= kMaxEntries) entries_.clear();
    entries_[std::move(key)] = {stamp, starts};
    return starts;
  }

 private:
  static constexpr size_t kMaxEntries = 4096;
  using Key = std::pair<std::string, uint64_t>;  // path, range bytes
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<std::string>()(k.first) ^
             (k.second * 0x9e3779b97f4a7c15);
    }
  };
  struct Stamp {
    uint64_t file_size;
    uint64_t index_size;
    int64_t index_mtime_ns;
    bool detect;  // whether the file's compression had to be detected
    bool operator==(const Stamp&) const = default;
  };
  struct Entry {
    Stamp stamp;
    std::shared_ptr<const RangeStarts> starts;
  };

  static std::shared_ptr<const RangeStarts> Load(const std::string& path,
                                                 const std::string& index_path,
                                                 const Stamp& stamp,
                                                 uint64_t range_bytes) {
    try {
      const records::Index index =
          records::ReadIndex(index_path, stamp.file_size);
      if (index.compression != records::Compression::kNone ||
          index.entries.empty()) {
        return nullptr;
      }
      if (stamp.detect && records::DetectCompression(records::ReadableFile(
                              path)) != records::Compression::kNone) {
        return nullptr;
      }
      auto starts = std::make_shared<RangeStarts>();
      const auto& entries = index.entries;
      for (uint64_t i = 0; i < entries.size(); ++i) {
        if (starts->empty() ||
            entries[i].offset - starts->back().first >= range_bytes) {
          starts->emplace_back(entries[i].offset, i);
        }
      }
      starts->emplace_back(entries.back().offset + entries.back().size,
                           entries.size());
      return starts;
    } catch (const std::exception&) {
      return nullptr;  // a damaged index: the file is read in one piece
    }
  }

  std::mutex mu_;
  std::unordered_map<Key, Entry, KeyHash> entries_;
};

// Never destroyed: iterators may still be ending while the process exits.
RangeIndexes& TheRangeIndexes() {
  static auto* indexes = new RangeIndexes;
  return *indexes;
}

std::atomic<uint64_t> ranges_read{0};
std::atomic<uint64_t> readers_made{0};

// One open file's records, read ahead by tasks in the arena.
//
// Read in one piece, a chunk is filled by one thread at a time: a reader
// task, or the planner itself when it needs a chunk that no task is
// filling (so the planner never waits on a task that has not started).
// The planner alone takes chunks.  A task's last touch of the reader is
// under mu_, and the destructor waits for it.
//
// Read by ranges (Env::ranges, and an index: RangeIndexes), each chunk is
// a range of records that the index places, and several tasks fill
// chunks at once, each with its own reads and CRC checks, so that one file
// is read on several cores (as records::ScanFile counts one).  The index
// only says where to start: a range is read by framing records from its
// start, exactly as the file is read in one piece, and its start is right
// when the range before it ended there.  The first range starts where the
// file is opened, so by induction every range that the one before it
// leads to holds exactly the records a reader of the whole file gives, and
// their errors.  A range that did not end where the next starts (a stale
// index) or that failed (damage: the error must come from where one piece
// would meet it) is dropped with every range after it, and the file is
// read in one piece from that range's start on; so is what follows the
// last indexed record.  Opened inside a range (a restored state), the file
// is read in one piece up to the next range's start, and by ranges from
// there only if that reading ends where the index puts the start.
class FileReader {
 public:
  // `shuffle_seed`: the file's (FileShuffleSeed), where each file is
  // shuffled (TFRecordOptions::shuffle_buffer_per_file).
  FileReader(Env* env, const FileSource* source,
             const std::shared_ptr<const std::string>& path, uint64_t offset,
             uint64_t index, uint64_t shuffle_seed = 0)
      : env_(env),
        source_(source),
        path_(path),
        piece_offset_(offset),
        piece_index_(index),
        shuffle_seed_(shuffle_seed) {
    readers_made.fetch_add(1, std::memory_order_relaxed);
    env_->readers.push_back(this);
    // Where each file is shuffled, its buffer takes its records in order.
    if (env_->ranges == nullptr || options().shuffle_buffer_per_file > 0) {
      return;
    }
    ranges_ = env_->ranges->Get(*path_, options(), env_->chunk_bytes);
    if (ranges_ == nullptr) return;
    // Ranges from where the file is opened when a range starts there (its
    // start, or a state saved between ranges).  Opened inside a range (a
    // state saved there), the file is read in one piece up to the next
    // range's start, and by ranges from there if that reading lands on it.
    const auto at = std::lower_bound(
        ranges_->begin(), ranges_->end(), index,
        [](const auto& start, uint64_t i) { return start.second < i; });
    if (at + 1 >= ranges_->end() ||
        (at->second == index && at->first != offset)) {
      ranges_ = nullptr;
      return;
    }
    lead_in_ = at->second != index;
    next_range_ = static_cast<size_t>(at - ranges_->begin());
  }

  // Waits for the reader tasks running now, which stop after their chunk,
  // not for those still queued: they find the reader gone and do nothing.
  // (A task queued behind parse tasks can start long after the planner,
  // on whose thread a reader goes, has read the file to its end itself:
  // the MNIST fixture's two-thread pipeline, a file an epoch, spent up to
  // a quarter of its run here; docs/PERFORMANCE.md.)
  ~FileReader() {
    std::erase(env_->readers, this);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    {
      std::unique_lock<std::shared_mutex> running(gate_->mu);
      gate_->reader = nullptr;
    }
    // No task reads now, and the planner (this thread) is not mid-chunk.
    if (here_ != nullptr) env_->ledger.Close(here_);
  }
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  // Opens the file now (so that a state naming a missing file fails when
  // it is restored, as the source's does).  Read by ranges, the file was
  // found when its index was looked up; ranges open it as they read.
  void OpenNow() {
    if (ranges_ == nullptr || lead_in_) Open();
  }

  // The next record; false at the end.  Throws the file's error at its
  // place; failed_at_open() then says whether the file could not be
  // opened at all.
  bool Next(RecordRef* out) {
    if (!Due()) return false;
    *out = ViewLedger::Ref(here_, pos_++);
    return true;
  }
  // Up to `n` next records appended to *out, as `n` calls of Next() would
  // (false: the file ended first; a throw leaves those taken before the
  // error in *out).
  bool Take(size_t n, std::vector<RecordRef>* out) {
    while (n > 0) {
      if (Left() == 0) {
        RecordRef r;
        if (!Next(&r)) return false;
        out->push_back(r);
        --n;
        continue;
      }
      const size_t k = std::min(n, Left());
      for (size_t i = 0; i < k; ++i) {
        out->push_back(ViewLedger::Ref(here_, pos_ + i));
      }
      pos_ += k;
      n -= k;
    }
    return true;
  }
  // Records of the current chunk that Next() hands out without reading
  // or waiting.
  size_t Buffered() const { return Left(); }
  // The next `k` (<= Buffered()) records, as `k` calls of Next() give
  // them, written to out[0], out[stride], ... out[(k - 1) * stride].
  void TakeBuffered(size_t k, RecordRef* out, size_t stride) {
    RecordView* views = here_->views.data() + pos_;
    for (size_t i = 0; i < k; ++i) out[i * stride] = {views + i, here_};
    here_->refs += k;
    pos_ += k;
  }
  bool failed_at_open() const { return failed_at_open_; }
  // Whether Next() would return without waiting for a reader task or
  // reading a chunk itself.
  bool Ready() {
    if (Left() > 0 || current_.error || current_.end) {
      return true;
    }
    std::lock_guard<std::mutex> lock(mu_);
    return !ready_.empty() && ready_.front().filled;
  }
  // Starts reading ahead if there is room.
  void Kick() {
    std::lock_guard<std::mutex> lock(mu_);
    KickLocked();
  }
  // Reads this file's next chunk here (the planner, waiting for another
  // file's) where it is read in one piece, read ahead, and no one is at
  // it: true if it did.  A task of its own queued meanwhile finds the
  // chunk read and reads the next, or ends.
  bool HelpRead() {
    std::unique_lock<std::mutex> lock(mu_);
    if (RangesLeft() || ranges_filling_ > 0 || filling_ || !WantsMore()) {
      return false;
    }
    FillAndPush(lock);
    KickLocked();
    planner_help_reads.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  // Waits until no task is reading (env_->paused keeps new ones off).
  void Quiesce() {
    std::unique_lock<std::mutex> lock(mu_);
    Wait(lock, [this] { return Idle(); });
  }
  // Where each file is shuffled: after Position(), the file's buffer and
  // the records drawn from it and not handed out (read ahead), and
  // whether an error read ahead is still to be thrown, in which case the
  // state reads on from where the error was, to meet it again
  // (quiesced).
  void SaveShuffle(StateWriter* w) const {
    if (shuffled_ == nullptr) {  // not opened yet: as made
      ShuffledFileRecords(path_, nullptr, options().shuffle_buffer_per_file,
                          shuffle_seed_)
          .Save(w);
      return;
    }
    std::vector<RecordView> drawn;
    if (Left() > 0) {
      drawn.assign(here_->views.begin() + static_cast<ptrdiff_t>(pos_),
                   here_->views.end());
    }
    bool error_ahead = current_.error != nullptr;
    for (const Chunk& c : ready_) {
      drawn.insert(drawn.end(), c.views.begin(), c.views.end());
      error_ahead = error_ahead || c.error != nullptr;
    }
    shuffled_->Save(w, drawn, error_ahead);
  }
  // Opens the file (made at the saved position) and restores its buffer.
  void RestoreShuffle(StateReader* r) {
    Open();
    shuffled_->Restore(r);
  }

  // The offset and index of the next record Next() returns (quiesced);
  // where each file is shuffled, where its buffer reads on.
  std::pair<uint64_t, uint64_t> Position() const {
    if (options().shuffle_buffer_per_file > 0) {
      if (!records_) return {piece_offset_, piece_index_};
      return {records_->next_offset(), records_->next_index()};
    }
    if (Left() > 0) {
      return {here_->views[pos_].offset, here_->views[pos_].index};
    }
    if (!ready_.empty()) return ready_.front().start;
    if (RangesLeft()) return (*ranges_)[next_range_];
    if (!records_) return {piece_offset_, piece_index_};
    return {records_->next_offset(), records_->next_index()};
  }

  // Ranges of files read so far by this process (for tests).
  static uint64_t RangesRead() {
    return ranges_read.load(std::memory_order_relaxed);
  }
  // Readers made so far by this process (for tests).
  static uint64_t Made() {
    return readers_made.load(std::memory_order_relaxed);
  }

 private:
  struct Chunk {
    std::vector<RecordView> views;
    std::vector<std::shared_ptr<const void>> blocks;  // KeepBlocksIn's
    std::pair<uint64_t, uint64_t> start;  // offset and index of views[0]
    std::exception_ptr error;             // after the views
    bool open_failed = false;
    bool end = false;  // nothing after this chunk
    // A range: its records [start.second, range_end) and the offset the
    // next range starts at; whether it was read whole and ended there.
    bool range = false;
    uint64_t range_end = 0;
    uint64_t next_offset = 0;
    bool sound = false;
    bool filled = true;  // false while a range is read into it
  };

  void Open() {
    if (records_) return;
    records_ = OpenFileRecords(path_, piece_offset_, piece_index_, options());
    if (options().shuffle_buffer_per_file > 0) {
      // The shuffle runs here, on the reader task that fills the chunk.
      auto shuffled = std::make_unique<ShuffledFileRecords>(
          path_, std::move(records_), options().shuffle_buffer_per_file,
          shuffle_seed_);
      shuffled_ = shuffled.get();
      records_ = std::move(shuffled);
    }
  }

  // Reads one chunk of the file in one piece (by the thread that set
  // filling_), ending before record `stop_at`.
  void Fill(Chunk* c, uint64_t stop_at) {
    BusyScope busy(source_->counter);
    uint64_t bytes = 0;
    try {
      if (!records_) {
        c->open_failed = true;
        Open();
        c->open_failed = false;
      }
      c->start = {records_->next_offset(), records_->next_index()};
      records_->KeepBlocksIn(&c->blocks);
      c->views.reserve(env_->chunk_records);
      while (c->views.size() < env_->chunk_records &&
             bytes < env_->chunk_bytes && records_->next_index() < stop_at) {
        RecordView& v = c->views.emplace_back();
        if (!records_->NextView(&v)) {
          c->views.pop_back();
          c->end = true;
          break;
        }
        bytes += v.size;
      }
    } catch (...) {
      if (!c->open_failed) c->views.pop_back();
      c->error = std::current_exception();
      c->end = true;
    }
    if (records_) records_->KeepBlocksIn(nullptr);
    Count(c->views.size(), bytes);
  }

  // Reads a range (by the thread that claimed it): sound when every one of
  // its records was read and the last ended where the next range starts.
  void FillRange(Chunk* c) {
    BusyScope busy(source_->counter);
    uint64_t bytes = 0;
    const uint64_t n = c->range_end - c->start.second;
    try {
      std::unique_ptr<FileRecords> r = OpenFileRange(
          path_, c->start.first, c->start.second, c->next_offset, options());
      r->KeepBlocksIn(&c->blocks);
      c->views.resize(n);
      for (RecordView& v : c->views) {
        if (!r->NextView(&v)) return;
        bytes += v.size;
      }
      if (r->next_offset() != c->next_offset) return;
    } catch (...) {
      return;  // read again in one piece, which reports it in its place
    }
    c->sound = true;
    ranges_read.fetch_add(1, std::memory_order_relaxed);
    Count(n, bytes);
  }

  void Count(uint64_t records, uint64_t bytes) {
    StageCounter* counter = source_->counter;
    counter->elements.fetch_add(records, std::memory_order_relaxed);
    counter->bytes.fetch_add(bytes, std::memory_order_relaxed);
  }

  // Chunks kept ready ahead of the planner: read by ranges, one per
  // thread, so that every thread can read one at once.
  size_t Ahead() const {
    return ranges_ != nullptr ? std::max<size_t>(kChunksAhead, env_->threads)
                              : kChunksAhead;
  }
  bool RangesLeft() const {
    return ranges_ != nullptr && !lead_in_ && next_range_ + 1 < ranges_->size();
  }

  // Under mu_.
  bool WantsMore() const {
    return env_->read_ahead && !stop_ && !ended_ && ready_.size() < Ahead() &&
           !env_->paused.load(std::memory_order_acquire) &&
           !env_->ctx->cancelled();
  }
  bool Idle() const { return tasks_ == 0 && !filling_ && ranges_filling_ == 0; }
  void KickLocked() {
    if (RangesLeft()) {
      // A task per range still to be read ahead.
      while (WantsMore() && ready_.size() + tasks_ < Ahead()) {
        EnqueueTaskLocked();
      }
      return;
    }
    if (tasks_ > 0 || filling_ || !WantsMore()) return;
    // With many files read at once (small chunks: 128 records each with
    // 16 files, every one consumed in ~2,000 records of the interleave),
    // a task waits until half the chunks ahead are taken and then reads
    // them all: each enqueue may wake a sleeping worker, a system call on
    // the planner's thread (on a VM an interrupt to an idle core, 8-14 us
    // in PrefetchPop), which was paid once every 128 records.  Full-size
    // chunks (few files at once, where one reader at 2 threads was tuned
    // to kChunksAhead) keep their reader going at each chunk taken.
    if (env_->chunk_records < kChunkRecords && ready_.size() * 2 > Ahead()) {
      return;
    }
    EnqueueTaskLocked();
  }
  // A reader task, through the gate: it runs RunTask while the reader
  // lives, and holds the gate shared meanwhile (the destructor takes it
  // exclusively).
  void EnqueueTaskLocked() {
    ++tasks_;
    env_->ReaderTaskQueued();
    env_->arena->enqueue([gate = gate_, env = env_] {
      {
        TaskRunning task;  // ends before the reader task is counted out
        std::shared_lock<std::shared_mutex> running(gate->mu);
        if (gate->reader != nullptr) gate->reader->RunTask();
      }
      env->ReaderTaskEnded();
    });
  }
  void RunTask() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (RangesLeft()) {
        if (!WantsMore()) break;
        FillRangeAndMark(lock);
      } else {
        // In one piece (past the ranges too): while no one else reads.
        if (filling_ || !WantsMore()) break;
        FillAndPush(lock);
      }
    }
    --tasks_;
    if (waiting_ > 0) cv_.notify_all();
  }
  // Reads a chunk with mu_ (held by `lock`) released meanwhile, and makes
  // it ready.  Only while no one else is filling.
  void FillAndPush(std::unique_lock<std::mutex>& lock) {
    filling_ = true;
    // Opened inside a range: one piece up to the next range's start.
    const uint64_t stop_at =
        lead_in_ ? (*ranges_)[next_range_].second : UINT64_MAX;
    lock.unlock();
    Chunk c;
    Fill(&c, stop_at);
    lock.lock();
    if (lead_in_ && !c.end && records_->next_index() == stop_at) {
      // Ranges from here if the records led here; else (a stale index)
      // one piece on.
      lead_in_ = false;
      if (records_->next_offset() == (*ranges_)[next_range_].first) {
        records_.reset();
      } else {
        ranges_ = nullptr;
      }
    }
    ended_ = ended_ || c.end;
    ready_.push_back(std::move(c));
    filling_ = false;
    if (waiting_ > 0) cv_.notify_all();
  }
  // Claims the next range (its place in ready_, in file order) and reads
  // it with mu_ released meanwhile.  The chunk stays where it is: the
  // planner takes only filled chunks, and drops chunks only when no range
  // is being read.
  void FillRangeAndMark(std::unique_lock<std::mutex>& lock) {
    Chunk& c = ready_.emplace_back();
    c.range = true;
    c.filled = false;
    c.start = (*ranges_)[next_range_];
    ++next_range_;
    c.range_end = (*ranges_)[next_range_].second;
    c.next_offset = (*ranges_)[next_range_].first;
    if (!RangesLeft()) {
      // What follows the last indexed record is read in one piece.
      piece_offset_ = c.next_offset;
      piece_index_ = c.range_end;
    }
    ++ranges_filling_;
    lock.unlock();
    FillRange(&c);
    lock.lock();
    c.filled = true;
    --ranges_filling_;
    if (waiting_ > 0) cv_.notify_all();
  }
  // The front range did not hold what reading in one piece gives: drops it
  // and the ranges after it (once none is being read), and reads the file
  // in one piece from its start.
  void ReadOnePieceFrom(std::unique_lock<std::mutex>& lock,
                        std::pair<uint64_t, uint64_t> start) {
    ranges_ = nullptr;  // no range is claimed from now on
    lead_in_ = false;
    // The piece after the last range may be being read too.
    Wait(lock, [this] { return ranges_filling_ == 0 && !filling_; });
    ready_.clear();
    piece_offset_ = start.first;
    piece_index_ = start.second;
    records_.reset();
    ended_ = false;
  }
  template <typename Pred>
  void Wait(std::unique_lock<std::mutex>& lock, Pred pred) {
    ++waiting_;
    cv_.wait(lock, pred);
    --waiting_;
  }

  // The planner: makes the next chunk current, reading it here when no
  // task is at it.
  void TakeChunk() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (!ready_.empty() && ready_.front().filled) {
        const Chunk& front = ready_.front();
        if (!front.range || front.sound) break;
        ReadOnePieceFrom(lock, front.start);
        continue;
      }
      if (ready_.empty() && RangesLeft()) {
        FillRangeAndMark(lock);
        continue;
      }
      if (ready_.empty() && !filling_) {
        FillAndPush(lock);
        continue;
      }
      // A task is reading the chunk: parse a queued batch, or read another
      // file's next chunk, rather than sleep meanwhile.
      if (env_->help || env_->help_read) {
        lock.unlock();
        const bool helped =
            (env_->help && env_->help()) ||
            (env_->help_read &&
             std::any_of(
                 env_->readers.begin(), env_->readers.end(),
                 [this](FileReader* r) { return r != this && r->HelpRead(); }));
        lock.lock();
        if (helped) continue;
      }
      WaitScope wait(source_->counter);
      Wait(lock, [this] {
        return ready_.empty() ? !filling_ : ready_.front().filled;
      });
    }
    current_ = std::move(ready_.front());
    ready_.pop_front();
    pos_ = 0;
    KickLocked();
    lock.unlock();
    // The views go to the ledger, which keeps them while refs to them are
    // out; the chunk before is closed.
    if (here_ != nullptr) env_->ledger.Close(here_);
    here_ = nullptr;
    here_ = env_->ledger.Adopt(std::move(current_.views),
                               std::move(current_.blocks));
    current_.views.clear();
    current_.blocks.clear();
  }

  // Records of the current chunk not yet handed out.
  size_t Left() const {
    return here_ != nullptr ? here_->views.size() - pos_ : 0;
  }
  // Whether a record is due (taking the next chunk when this one is
  // spent); false at the file's end.  Throws the file's error at its place.
  bool Due() {
    while (Left() == 0) {
      if (current_.error) {
        std::exception_ptr e = std::move(current_.error);
        current_.error = nullptr;
        current_.end = true;
        failed_at_open_ = current_.open_failed;
        std::rethrow_exception(e);
      }
      if (current_.end) return false;
      TakeChunk();
    }
    return true;
  }

  const TFRecordOptions& options() const { return *source_->options; }

  Env* env_;
  const FileSource* const source_;
  const std::shared_ptr<const std::string>& path_;
  // Where reading in one piece starts: where the file is opened, or where
  // ranges stopped.
  uint64_t piece_offset_;
  uint64_t piece_index_;
  const uint64_t shuffle_seed_;
  std::unique_ptr<FileRecords> records_;     // by whoever fills
  ShuffledFileRecords* shuffled_ = nullptr;  // records_, when shuffled

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Chunk> ready_;
  int waiting_ = 0;         // threads in cv_.wait: notify only then
  int tasks_ = 0;           // tasks enqueued or running
  bool filling_ = false;    // a chunk is being read in one piece
  int ranges_filling_ = 0;  // ranges being read
  bool ended_ = false;      // a chunk with the end was read
  bool stop_ = false;
  // Read by ranges: where they start (null: in one piece), and the next
  // range's place there.
  std::shared_ptr<const RangeStarts> ranges_;
  size_t next_range_ = 0;
  // Opened inside a range: read in one piece up to next_range_'s start.
  bool lead_in_ = false;

  // What the reader's tasks hold of it: the reader until it goes.
  struct Gate {
    std::shared_mutex mu;  // shared: a task running; exclusive: going
    FileReader* reader = nullptr;
  };
  const std::shared_ptr<Gate> gate_ = MakeGate(this);
  static std::shared_ptr<Gate> MakeGate(FileReader* reader) {
    auto gate = std::make_shared<Gate>();
    gate->reader = reader;
    return gate;
  }

  // The planner's: the current chunk (its views in here_, the ledger's).
  Chunk current_;
  ViewChunk* here_ = nullptr;
  size_t pos_ = 0;
  bool failed_at_open_ = false;
};

// RecordStream::Take by `n` calls of stream->Next(), which for a final
// Stream is no virtual call (RecordStream's own Take calls it virtually).  Each
// record is written in its place in *out (a ref copied out of a local the call
// just wrote stalls on the store's forwarding).
// (`next` is the Next of a stream, or what it calls under its own scope.)
template <typename NextFn>
bool TakeByCalls(const NextFn& next, size_t n, std::vector<RecordRef>* out) {
  for (; n > 0; --n) {
    RecordRef& r = out->emplace_back();
    bool got;
    try {
      got = next(&r);
    } catch (...) {
      out->pop_back();
      throw;
    }
    if (!got) {
      out->pop_back();
      return false;
    }
  }
  return true;
}
template <typename Stream>
bool TakeByNext(Stream* stream, size_t n, std::vector<RecordRef>* out) {
  return TakeByCalls([stream](RecordRef* r) { return stream->Next(r); }, n,
                     out);
}

// A stream of records, handed on by reference (RecordRef): a fused stage
// on the planner's thread.  Whoever takes a ref retires it
// (ViewLedger::Retire).
class RecordStream {
 public:
  explicit RecordStream(Env* env) : env_(env) {}
  virtual ~RecordStream() {
    if (loose_ != nullptr) env_->ledger.Close(loose_);
  }
  RecordStream(const RecordStream&) = delete;
  RecordStream& operator=(const RecordStream&) = delete;
  virtual bool Next(RecordRef* out) = 0;
  // Up to `n` next records appended to *out, the same as `n` calls of
  // Next() would give (false: the stream ended first).  After a throw, the
  // records taken before the error are in *out.  Stages that can hand on
  // runs of records override it: the planner takes a batch at once instead
  // of a chain of calls a record.
  virtual bool Take(size_t n, std::vector<RecordRef>* out) {
    return TakeByNext(this, n, out);
  }
  // Waits until no reader task below is running (Env::paused set).
  virtual void Quiesce() = 0;
  // Starts reading ahead again after Env::paused was cleared.
  virtual void Resume() = 0;
  // Before the first Next: starts reading ahead (where reader tasks read
  // ahead at all), so that a stream made early, such as Repeat's next
  // epoch, has its first records ready when its turn comes.  Changes
  // nothing of what the stream delivers or saves.
  virtual void Prepare() {}
  // Whether the stream has read all of its input and only hands out what
  // it holds (a shuffle's buffer draining): its Next() reads nothing.
  virtual bool Draining() const { return false; }
  // Before the first Next: reads up to `n` of the records the first
  // Next() calls would read into the stream's own buffer (a shuffle's),
  // drawing none.  Work moved earlier, nothing else: the same records in
  // the same order, and the same state once those calls have run.  An
  // error it meets is kept and thrown by the Next() that would have met
  // it.  Streams without a buffer do nothing.
  virtual void FillAhead(size_t /*n*/) {}
  virtual void Save(StateWriter* w) = 0;
  virtual void Restore(StateReader* r) = 0;

 protected:
  // A ref to `view`, kept in a chunk of the stream's own: for streams
  // whose views are in no reader's chunk (the global shuffle's, planned
  // unread).
  RecordRef Keep(RecordView&& view) {
    constexpr size_t kLooseViews = 256;
    if (loose_ == nullptr || loose_->views.size() == kLooseViews) {
      if (loose_ != nullptr) env_->ledger.Close(loose_);
      loose_ = nullptr;
      std::vector<RecordView> views;
      views.reserve(kLooseViews);  // never grows: refs point into it
      loose_ = env_->ledger.Adopt(std::move(views));
    }
    loose_->views.push_back(std::move(view));
    return ViewLedger::Ref(loose_, loose_->views.size() - 1);
  }
  // Next() as Take(1), for streams whose Take() does the work.
  bool NextThroughTake(RecordRef* out) {
    one_.clear();
    if (!Take(1, &one_)) return false;
    *out = one_.front();
    return true;
  }

  Env* const env_;

 private:
  ViewChunk* loose_ = nullptr;  // Keep's chunk (the ledger's)
  std::vector<RecordRef> one_;  // NextThroughTake()'s
};

using StreamMaker = std::function<std::unique_ptr<RecordStream>(uint64_t)>;

// The TFRecord source (TFRecordDataset's iterator over views): the files
// in their order, num_parallel_reads at once, one record from each in
// turn; a finished file's slot takes the next file when the cycle comes
// back to it.  The next file is opened (and read ahead) early.
class SourceStream final : public RecordStream {
 public:
  SourceStream(Env* env, const FusableStage& stage, uint64_t salt)
      : RecordStream(env),
        source_(&env->Source(stage.dataset)),
        order_(stage.file_order(env->ctx, salt)),
        epoch_seed_(stage.tfrecord->shuffle_buffer_per_file > 0
                        ? stage.shuffle_seed(env->ctx, salt)
                        : 0),
        slots_(static_cast<size_t>(stage.tfrecord->num_parallel_reads)) {}

  // The turn's file's next record.
  bool Next(RecordRef* out) override {
    while (true) {
      if (open_ == 0 && next_file_ >= order_.size()) return false;
      Slot& slot = slots_[cycle_];
      if (!source_->options->deterministic && slot.reader &&
          TakeReadyElsewhere(out)) {
        return true;
      }
      if (slot.reader) {
        bool got;
        try {
          got = slot.reader->Next(out);
        } catch (...) {
          CloseAfterError(slot);
          throw;
        }
        if (got) {
          if (++block_index_ ==
              static_cast<uint64_t>(source_->options->block_length)) {
            Advance();
          }
          return true;
        }
        Close(slot);
      } else if (next_file_ < order_.size()) {
        Open(slot, next_file_++);
      } else {
        Advance();
      }
    }
  }

  // One file at a time (num_parallel_reads 1): runs of the open file's
  // records; the cycle and block counter end as Next() would leave them.
  // Several: whole turns of the cycle at once where every file has them
  // read (FullTurns), else Next().
  bool Take(size_t n, std::vector<RecordRef>* out) override {
    if (slots_.size() != 1) {
      const size_t files = slots_.size();
      while (n > 0) {
        const size_t turns = FullTurns(n);
        if (turns == 0) {
          if (!TakeByNext(this, 1, out)) return false;
          --n;
          continue;
        }
        // Turn t's record from the j-th file after the cycle's place goes
        // to t * files + j: as Next() hands them out, one a file in turn.
        const size_t first = out->size();
        out->resize(first + turns * files);
        RecordRef* to = out->data() + first;
        for (size_t j = 0; j < files; ++j) {
          slots_[(cycle_ + j) % files].reader->TakeBuffered(turns, to + j,
                                                            files);
        }
        n -= turns * files;
      }
      return true;
    }
    const auto block_length =
        static_cast<uint64_t>(source_->options->block_length);
    Slot& slot = slots_[0];
    while (n > 0) {
      if (!slot.reader) {
        if (next_file_ >= order_.size()) return false;
        Open(slot, next_file_++);
        continue;
      }
      const size_t before = out->size();
      bool more;
      try {
        more = slot.reader->Take(n, out);
      } catch (...) {
        block_index_ = (block_index_ + (out->size() - before)) % block_length;
        CloseAfterError(slot);
        throw;
      }
      const size_t got = out->size() - before;
      block_index_ = (block_index_ + got) % block_length;
      n -= got;
      if (!more) Close(slot);
    }
    return true;
  }

  // Opens the first file ahead, as Open() opens the next one.
  void Prepare() override {
    if (next_file_ != 0 || ahead_ || order_.empty()) return;
    ahead_ = MakeReader(0, 0, 0);
    ahead_index_ = 0;
    ahead_->Kick();
  }

  void Quiesce() override {
    for (auto& s : slots_) {
      if (s.reader) s.reader->Quiesce();
    }
    if (ahead_) ahead_->Quiesce();
  }
  void Resume() override {
    for (auto& s : slots_) {
      if (s.reader) s.reader->Kick();
    }
    if (ahead_) ahead_->Kick();
  }

  // TFRecordDataset's layout: the cycle, the next file, and per slot the
  // file's place in the order and its next offset and record.
  void Save(StateWriter* w) override {
    w->BeginStage("tfrecord");
    w->U64(cycle_);
    if (source_->options->block_length != 1) w->U64(block_index_);
    w->U64(next_file_);
    for (const Slot& slot : slots_) {
      w->Bool(slot.reader != nullptr);
      if (slot.reader) {
        const auto [offset, index] = slot.reader->Position();
        w->U64(slot.order_index);
        w->U64(offset);
        w->U64(index);
        if (Shuffled()) slot.reader->SaveShuffle(w);
      }
    }
  }
  void Restore(StateReader* r) override {
    r->BeginStage("tfrecord");
    cycle_ = r->U64();
    block_index_ = source_->options->block_length != 1 ? r->U64() : 0;
    next_file_ = r->U64();
    if (cycle_ >= slots_.size() || next_file_ > order_.size() ||
        block_index_ >= static_cast<uint64_t>(source_->options->block_length)) {
      throw Error("tfrecord state: position out of range");
    }
    ahead_.reset();
    open_ = 0;
    for (Slot& slot : slots_) {
      slot.reader.reset();
      if (!r->Bool()) continue;
      const uint64_t index = r->U64();
      const uint64_t offset = r->U64();
      const uint64_t record = r->U64();
      if (index >= order_.size()) {
        throw Error("tfrecord state: file out of range");
      }
      slot.reader = MakeReader(index, offset, record);
      if (Shuffled()) {
        slot.reader->RestoreShuffle(r);
      } else {
        slot.reader->OpenNow();
      }
      slot.order_index = index;
      ++open_;
    }
  }

 private:
  struct Slot {
    std::unique_ptr<FileReader> reader;
    size_t order_index = 0;
  };

  const std::shared_ptr<const std::string>& Path(size_t order_index) const {
    return (*env_->paths)[source_->first_file + order_[order_index]];
  }
  bool Shuffled() const {
    return source_->options->shuffle_buffer_per_file > 0;
  }
  std::unique_ptr<FileReader> MakeReader(size_t order_index, uint64_t offset,
                                         uint64_t record) const {
    return std::make_unique<FileReader>(
        env_, source_, Path(order_index), offset, record,
        Shuffled() ? FileShuffleSeed(epoch_seed_, order_[order_index]) : 0);
  }
  void Open(Slot& slot, size_t order_index) {
    if (ahead_ && ahead_index_ == order_index) {
      slot.reader = std::move(ahead_);
    } else {
      slot.reader = MakeReader(order_index, 0, 0);
    }
    slot.order_index = order_index;
    ++open_;
    slot.reader->Kick();
    if (next_file_ < order_.size()) {
      ahead_ = MakeReader(next_file_, 0, 0);
      ahead_index_ = next_file_;
      ahead_->Kick();
    }
  }
  void Close(Slot& slot) {
    slot.reader.reset();
    --open_;
    Advance();
  }
  // After the slot's reader threw: a file that could not be opened leaves
  // the slot empty and the cycle where it is (as the source does); any
  // other error closes the file.
  void CloseAfterError(Slot& slot) {
    if (slot.reader->failed_at_open()) {
      slot.reader.reset();
      --open_;
    } else {
      Close(slot);
    }
  }
  void Advance() {
    cycle_ = (cycle_ + 1) % slots_.size();
    block_index_ = 0;
  }

  // Whole turns of the cycle (a record from every slot's file, in order)
  // that Take can hand out at once, at most n / slots: where every slot
  // has a file, each takes one record a turn (block_length 1), and the
  // order is fixed (deterministic), as many as every file has read and
  // not handed out.  A turn leaves the cycle where it was.
  size_t FullTurns(size_t n) const {
    const TFRecordOptions& options = *source_->options;
    if (n < slots_.size() || open_ != slots_.size() || !options.deterministic ||
        options.block_length != 1) {
      return 0;
    }
    size_t turns = n / slots_.size();
    for (const Slot& slot : slots_) {
      turns = std::min(turns, slot.reader->Buffered());
    }
    return turns;
  }

  // deterministic = false: when the file whose turn it is has no record
  // ready, the next record of another open file that has one (its
  // records keep their order; the cycle stays where it is).  False when
  // the turn's file is ready or no other is.
  bool TakeReadyElsewhere(RecordRef* out) {
    if (slots_[cycle_].reader->Ready()) return false;
    for (size_t k = 1; k < slots_.size(); ++k) {
      Slot& other = slots_[(cycle_ + k) % slots_.size()];
      if (!other.reader || !other.reader->Ready()) continue;
      try {
        if (other.reader->Next(out)) return true;
      } catch (...) {
        other.reader.reset();  // as a file's error closes its slot
        --open_;
        throw;
      }
      // That file ended: its slot takes the next file when its turn comes.
      other.reader.reset();
      --open_;
    }
    return false;
  }

  const FileSource* const source_;
  std::vector<size_t> order_;
  const uint64_t epoch_seed_;  // where each file is shuffled
  std::vector<Slot> slots_;
  size_t cycle_ = 0;
  uint64_t block_index_ = 0;  // records taken from slots_[cycle_]
  size_t next_file_ = 0;
  size_t open_ = 0;
  std::unique_ptr<FileReader> ahead_;  // the file next_file_ names
  size_t ahead_index_ = 0;
};

// The global shuffle (its stage's iterator over views): the cursor's
// records, planned unread; the parse calls read them (UnreadFiles), so the
// random reads of a batch run on every core instead of one at a time here.
class GlobalShuffleStream final : public RecordStream {
 public:
  GlobalShuffleStream(Env* env, const FusableStage& stage, uint64_t salt)
      : RecordStream(env),
        files_(env->globals.at(stage.dataset)),
        cursor_(stage.global, stage.shuffle_seed(env->ctx, salt)) {}

  bool Next(RecordRef* out) override {
    size_t file = 0;
    uint64_t index = 0;
    if (!cursor_.Next(&file, &index)) return false;
    *out = Keep(UnreadView(*env_, files_, file, index));
    return true;
  }
  void Quiesce() override {}
  void Resume() override {}
  void Save(StateWriter* w) override { cursor_.Save(w); }
  void Restore(StateReader* r) override { cursor_.Restore(r); }

 private:
  const GlobalFiles& files_;
  GlobalShuffleCursor cursor_;
};

// TensorFlow's buffered shuffle (ShuffleDataset's iterator over views).
// Its own work (the draws, the buffer, CompactOld) counts as the stage
// "shuffle", as the unfused Shuffle's does; its input's as the planner's.
class ShuffleStream final : public RecordStream {
 public:
  ShuffleStream(Env* env, const FusableStage& stage, uint64_t salt,
                std::unique_ptr<RecordStream> in)
      : RecordStream(env),
        buffer_size_(stage.buffer_size),
        in_(std::move(in)),
        rng_(stage.shuffle_seed(env->ctx, salt)),
        clock_(stage.buffer_size),
        counter_(env->ctx->Counter(stage.dataset, "shuffle")) {
    buffer_.reserve(
        static_cast<size_t>(std::min<int64_t>(buffer_size_, int64_t{1} << 20)));
  }
  ~ShuffleStream() override { RetireBuffer(); }

  bool Next(RecordRef* out) override {
    BusyScope busy(counter_);
    const bool got = Draw(out);
    Drew(got ? 1 : 0);
    return got;
  }

  // Next() `n` times (TakeDraws), under one BusyScope.
  bool Take(size_t n, std::vector<RecordRef>* out) override {
    BusyScope busy(counter_);
    const size_t before = out->size();
    bool more = true;
    try {
      more = TakeDraws(n, out);
    } catch (...) {
      Drew(out->size() - before);
      throw;
    }
    Drew(out->size() - before);
    return more;
  }

  void Quiesce() override { in_->Quiesce(); }
  void Resume() override { in_->Resume(); }
  void Prepare() override { in_->Prepare(); }
  bool Draining() const override { return input_end_; }
  void FillAhead(size_t n) override {
    BusyScope busy(counter_);
    ahead_.Fill(
        std::min<size_t>(n, 1), [this] { return Filling(); },
        [this, n] { ReadSome(n); });
    NoteFill();
  }

  void Save(StateWriter* w) override {
    w->BeginStage("shuffle");
    w->U64(rng_.state());
    w->Bool(input_end_);
    w->U64(buffer_.size());
    for (const Entry& e : buffer_) WriteView(w, *env_, *e.ref.view);
    in_->Save(w);
  }
  void Restore(StateReader* r) override {
    r->BeginStage("shuffle");
    rng_.set_state(r->U64());
    input_end_ = r->Bool();
    const uint64_t n = r->U64();
    if (n > static_cast<uint64_t>(buffer_size_)) {
      r->Fail(fmt::format("{} elements in a buffer of {}", n, buffer_size_));
    }
    RetireBuffer();
    ReferenceReader refs;
    for (uint64_t i = 0; i < n; ++i) {
      buffer_.push_back({Keep(ReadView(r, *env_, &refs)), clock_.Now()});
    }
    in_->Restore(r);
  }

 private:
  struct Entry {
    RecordRef ref;
    uint64_t inserted = 0;  // its stamp (CompactionClock)
  };
  static constexpr uint64_t kPeek = 16;
  // Records a run of Take draws at once.
  static constexpr size_t kRun = 64;

  // Next(), under the caller's BusyScope (one a call, not one a record).
  bool Draw(RecordRef* out) {
    ahead_.ThrowKept();  // met by FillAhead where this call meets it
    while (Filling()) ReadSome(static_cast<size_t>(buffer_size_));
    if (buffer_.empty()) return false;
    // The entry a draw kPeek draws ahead will take, if the buffer stays
    // this full (it does until the input ends): asked for now, so that
    // the draws' cache misses overlap instead of coming one by one.
    __builtin_prefetch(&buffer_[rng_.PeekBelow(buffer_.size(), kPeek)], 1, 3);
    const size_t i = static_cast<size_t>(rng_.Below(buffer_.size()));
    *out = buffer_[i].ref;
    if (i + 1 != buffer_.size()) buffer_[i] = buffer_.back();
    buffer_.pop_back();
    return true;
  }

  // Next() `n` times, with the draws of a full buffer taken in runs: while
  // the input lasts, each record drawn is the one at a draw below the
  // buffer size B, with the input's next record at B - 1 (Next() appends
  // it, draws, and moves the last entry into the drawn one's place); here
  // the run's input records are taken at once, the draws (a counter-based
  // generator: independent of each other) computed ahead, and the drawn
  // entry replaced by the input record directly.  The same records in the
  // same order, the same generator state and buffer as Next() leaves.
  bool TakeDraws(size_t n, std::vector<RecordRef>* out) {
    ahead_.ThrowKept();
    while (n > 0) {
      if (!Filling() ||
          buffer_.size() + 1 != static_cast<size_t>(buffer_size_)) {
        if (!TakeByCalls([this](RecordRef* r) { return Draw(r); }, 1, out)) {
          return false;
        }
        --n;
        continue;
      }
      const size_t before = out->size();
      TakeRun(std::min(n, kRun), out);
      n -= out->size() - before;  // an input that ended: the rest drained
    }
    return true;
  }

  // `n` records drawn: counted, and the buffer's fill noted.
  void Drew(size_t n) {
    counter_->elements.fetch_add(n, std::memory_order_relaxed);
    NoteFill();
  }
  void NoteFill() {
    counter_->buffered.store(static_cast<int64_t>(buffer_.size()),
                             std::memory_order_relaxed);
  }

  // The input's next `n` records into run_in_ (cleared first), in one call
  // whose time is the planner's; whether the input goes on.  An error is
  // kept in *error, after the records before it.
  bool TakeInput(size_t n, std::exception_ptr* error) {
    run_in_.clear();
    try {
      BusyScope input(env_->plan_counter);
      return in_->Take(n, &run_in_);
    } catch (...) {
      *error = std::current_exception();
      return true;
    }
  }

  // `run` records of a full buffer (B - 1 entries and the input not
  // ended) into *out: the input's next `run` records, each into the place
  // of the entry its draw takes.  An input that ends or fails within the
  // run: the records before are drawn as Next() would have drawn them,
  // then input_end_ is set or the error thrown, the buffer at B - 1.
  void TakeRun(size_t run, std::vector<RecordRef>* out) {
    std::exception_ptr error;
    const bool more = TakeInput(run, &error);
    const size_t got = run_in_.size();
    const uint64_t b = static_cast<uint64_t>(buffer_size_);
    const uint64_t last = b - 1;
    uint64_t draws[kRun];
    for (size_t k = 0; k < got; ++k) draws[k] = rng_.PeekBelow(b, k);
    for (size_t k = 0; k < got && k < kPeek; ++k) {
      if (draws[k] != last) __builtin_prefetch(&buffer_[draws[k]], 1, 3);
    }
    const size_t first = out->size();
    out->resize(first + got);
    RecordRef* to = out->data() + first;
    for (size_t k = 0; k < got; ++k) {
      if (k + kPeek < got && draws[k + kPeek] != last) {
        __builtin_prefetch(&buffer_[draws[k + kPeek]], 1, 3);
      }
      const uint64_t stamp = clock_.Stamp();
      // Next() sweeps with the new record at the back; being new, it is
      // not one a sweep copies, so the sweep without it is the same.
      if (clock_.SweepDue()) CompactOld();
      if (draws[k] == last) {
        to[k] = run_in_[k];
        continue;
      }
      Entry& e = buffer_[draws[k]];
      to[k] = e.ref;
      e.ref = run_in_[k];
      e.inserted = stamp;
    }
    rng_.set_state(rng_.state() + got);
    if (error) std::rethrow_exception(error);
    if (!more) input_end_ = true;
  }

  bool Filling() const {
    return !input_end_ && static_cast<int64_t>(buffer_.size()) < buffer_size_;
  }
  // Up to `n` records of the input into the buffer, no more than fill it
  // (fewer where the input ends: its end noted), in one call of the
  // input's (the input's time is the planner's: one BusyScope a call, not
  // one a record).  An error at its place: the records before it are
  // buffered, as one by one, and it is thrown.
  void ReadSome(size_t n) {
    n = std::min(n, static_cast<size_t>(buffer_size_) - buffer_.size());
    std::exception_ptr error;
    const bool more = TakeInput(n, &error);
    for (const RecordRef& r : run_in_) {
      buffer_.push_back({r, clock_.Stamp()});
      if (clock_.SweepDue()) CompactOld();
    }
    if (error) std::rethrow_exception(error);
    if (!more) input_end_ = true;
  }
  void RetireBuffer() {
    for (const Entry& e : buffer_) env_->ledger.Retire(e.ref);
    buffer_.clear();
  }

  // Copies out the views that have been buffered for kCompactAfter buffer
  // lengths and still hold a larger block.  (The only views the planner
  // touches: a fraction e^-3 of them under TensorFlow's shuffle.)  A view
  // looked at is settled: it holds no block (or its own bytes) from then
  // on, and later sweeps pass it without reading it again (each would
  // be a cache miss: ~5 ns a record on the planner's thread).
  //
  // A reader's chunk holds the blocks its views view (ViewChunk::blocks),
  // so every view looked at moves to a chunk of the shuffle's own (Keep)
  // and its entry's ref with it: the old ref is retired, and the chunk and
  // its blocks go once none of its records is buffered.  Its bytes are
  // copied unless it owns small bytes of its own (a record across blocks).
  //
  // The copies go into small shared chunks (RecordArena), not a buffer
  // each: an aligned allocation per copy was a quarter of the planner's
  // time (perf, Fashion-MNIST shuffled, one thread).  A chunk goes when its
  // last record leaves the buffer; chunks of kCompactedChunkBytes keep
  // that a small part of what the blocks held.  The old views and their
  // bytes are cold: they are found first, then each copied with the next
  // ones' lines asked for, so that the misses overlap.
  void CompactOld() {
    old_.clear();
    for (Entry& e : buffer_) {
      if (clock_.Settle(&e.inserted)) old_.push_back(&e);
    }
    constexpr size_t kViewsAhead = 4;
    constexpr size_t kBytesAhead = 2;
    for (size_t i = 0; i < old_.size() && i < kViewsAhead; ++i) {
      __builtin_prefetch(old_[i]->ref.view, 0, 3);
    }
    for (size_t i = 0; i < old_.size(); ++i) {
      if (i + kViewsAhead < old_.size()) {
        __builtin_prefetch(old_[i + kViewsAhead]->ref.view, 0, 3);
      }
      if (i + kBytesAhead < old_.size()) {
        const RecordView& ahead = *old_[i + kBytesAhead]->ref.view;
        if (ahead.data != nullptr && !ahead.unread) {
          const size_t lines = std::min<size_t>((ahead.size + 63) / 64, 64);
          for (size_t l = 0; l < lines; ++l) {
            __builtin_prefetch(ahead.data + 64 * l, 0, 0);
          }
        }
      }
      Entry& e = *old_[i];
      if (e.ref.view->unread) continue;
      RecordView moved = std::move(*e.ref.view);
      if (ViewsALargerBuffer(moved)) compacted_.Copy(moved.bytes(), &moved);
      const RecordRef old_ref = e.ref;
      e.ref = Keep(std::move(moved));
      env_->ledger.Retire(old_ref);
    }
  }

  const int64_t buffer_size_;
  std::unique_ptr<RecordStream> in_;
  Rng rng_;
  CompactionClock clock_;  // when CompactOld runs, and which entries it copies
  StageCounter* const counter_;  // "shuffle"
  std::vector<Entry> buffer_;
  bool input_end_ = false;
  AheadFiller ahead_;              // FillAhead's kept error, for Next to throw
  std::vector<RecordRef> run_in_;  // TakeRun's input records
  std::vector<Entry*> old_;        // CompactOld's views to copy
  RecordArena compacted_{kCompactedChunkBytes};  // CompactOld's copies
};

// Repeat (RepeatDataset's iterator): a fresh input per epoch, salted by
// the epoch.
class RepeatStream final : public RecordStream {
 public:
  // Where readers read ahead, the inputs of the next epoch (of the next
  // EpochsPrepared(threads) where epochs are short) are made as an epoch
  // opens, and their readers start: an epoch's first records (all of them,
  // for a file shorter than the read-ahead under a larger shuffle buffer)
  // are then not read while the planner waits at the epoch's start.
  RepeatStream(Env* env, const FusableStage& stage, uint64_t salt,
               StreamMaker make_input)
      : RecordStream(env),
        epochs_(stage.count, salt, std::move(make_input),
                env->read_ahead ? [](RecordStream& next) { next.Prepare(); }
                                : std::function<void(RecordStream&)>(),
                EpochsPrepared(env->threads), kShortEpochRecords) {}

  bool Next(RecordRef* out) override {
    while (RecordStream* in = epochs_.Begin()) {
      if (in->Next(out)) {
        epochs_.Handed(1);
        return true;
      }
      if (!epochs_.EndEpoch()) return false;
    }
    return false;
  }
  bool Take(size_t n, std::vector<RecordRef>* out) override {
    while (n > 0) {
      RecordStream* in = epochs_.Begin();
      if (in == nullptr) return false;
      const size_t before = out->size();
      bool more;
      try {
        more = in->Take(n, out);
      } catch (...) {
        epochs_.HandedBeforeAnError(out->size() - before);
        throw;
      }
      const size_t got = out->size() - before;
      n -= got;
      epochs_.Handed(got);
      if (!more && !epochs_.EndEpoch()) return false;
    }
    return true;
  }

  void Quiesce() override {
    if (epochs_.input()) epochs_.input()->Quiesce();
    epochs_.ForEachAhead([](RecordStream& in) { in.Quiesce(); });
  }
  void Resume() override {
    if (epochs_.input()) epochs_.input()->Resume();
    epochs_.ForEachAhead([](RecordStream& in) { in.Resume(); });
  }
  void Prepare() override { epochs_.Prepare(); }

  void Save(StateWriter* w) override { epochs_.Save(w); }
  void Restore(StateReader* r) override { epochs_.Restore(r); }

 private:
  RepeatEpochs<RecordStream> epochs_;
};

// Take and Skip (CountDataset's iterator over views): the first `count`
// records kept or dropped (-1: all), the records counted so far its
// state.  An error met while skipping is thrown there, the records
// skipped before it counted, as the stage does.
class CountStream final : public RecordStream {
 public:
  CountStream(Env* env, const FusableStage& stage,
              std::unique_ptr<RecordStream> in)
      : RecordStream(env),
        in_(std::move(in)),
        skip_(stage.kind == FusableStage::Kind::kSkip),
        count_(stage.count),
        counter_(env->ctx->Counter(stage.dataset, skip_ ? "skip" : "take")) {}

  bool Next(RecordRef* out) override { return NextThroughTake(out); }
  bool Take(size_t n, std::vector<RecordRef>* out) override {
    if (n == 0) return true;
    if (skip_ && !SkipAll()) return false;
    size_t want = n;
    if (!skip_ && count_ >= 0) {
      want = static_cast<size_t>(
          std::min<int64_t>(count_ - seen_, static_cast<int64_t>(n)));
      if (want == 0) return false;  // the input is not read on
    }
    const size_t before = out->size();
    bool more;
    try {
      more = in_->Take(want, out);
    } catch (...) {
      Counted(out->size() - before);
      throw;
    }
    Counted(out->size() - before);
    return more && want == n;
  }

  void Quiesce() override { in_->Quiesce(); }
  void Resume() override { in_->Resume(); }
  void Prepare() override { in_->Prepare(); }

  // The stage's layout: the records counted, then the input.
  void Save(StateWriter* w) override {
    SaveCounted(w, skip_ ? "skip" : "take", seen_);
    in_->Save(w);
  }
  void Restore(StateReader* r) override {
    seen_ =
        RestoreCounted(r, skip_ ? "skip" : "take", count_,
                       fmt::format("{}({})", skip_ ? "Skip" : "Take", count_));
    in_->Restore(r);
  }

 private:
  // Skip: drops the records still to skip (retired as they come); false
  // where the input ended first, or where every record is skipped.
  bool SkipAll() {
    constexpr int64_t kRun = 256;
    while (count_ < 0 || seen_ < count_) {
      const int64_t left = count_ < 0 ? kRun : std::min(count_ - seen_, kRun);
      dropped_.clear();
      bool more;
      try {
        more = in_->Take(static_cast<size_t>(left), &dropped_);
      } catch (...) {
        Drop();
        throw;
      }
      Drop();
      if (!more) return false;
    }
    return true;
  }
  void Drop() {
    seen_ += static_cast<int64_t>(dropped_.size());
    env_->ledger.Retire(dropped_);
    dropped_.clear();
  }
  // Records given on: Take's count, and the stage's elements.
  void Counted(size_t n) {
    if (!skip_) seen_ += static_cast<int64_t>(n);
    counter_->elements.fetch_add(n, std::memory_order_relaxed);
  }

  std::unique_ptr<RecordStream> in_;
  const bool skip_;
  const int64_t count_;
  StageCounter* const counter_;  // "take" or "skip"
  int64_t seen_ = 0;
  std::vector<RecordRef> dropped_;  // SkipAll()'s
};

// Shard (ShardDataset's iterator over views): its input's records
// shard_index, shard_index + count, ...; the others are dropped as they
// are read.  The index of the input's next record is its state; an error
// is thrown where the stage throws it, the records before it counted.
class ShardStream final : public RecordStream {
 public:
  ShardStream(Env* env, const FusableStage& stage,
              std::unique_ptr<RecordStream> in)
      : RecordStream(env),
        in_(std::move(in)),
        shards_(stage.count),
        index_(stage.shard_index),
        counter_(env->ctx->Counter(stage.dataset, "shard")) {}

  bool Next(RecordRef* out) override { return NextThroughTake(out); }
  // The input's records up to this shard's n-th next one, taken at once.
  bool Take(size_t n, std::vector<RecordRef>* out) override {
    if (n == 0) return true;
    const int64_t first =
        next_index_ + ((index_ - next_index_) % shards_ + shards_) % shards_;
    const int64_t span =
        first - next_index_ + static_cast<int64_t>(n - 1) * shards_ + 1;
    read_.clear();
    std::exception_ptr error;
    bool more = true;
    try {
      more = in_->Take(static_cast<size_t>(span), &read_);
    } catch (...) {
      error = std::current_exception();
    }
    size_t kept = 0;
    for (const RecordRef& r : read_) {
      if (next_index_++ % shards_ == index_) {
        out->push_back(r);
        ++kept;
      } else {
        env_->ledger.Retire(r);
      }
    }
    read_.clear();
    counter_->elements.fetch_add(kept, std::memory_order_relaxed);
    if (error) std::rethrow_exception(error);
    return more && kept == n;
  }

  void Quiesce() override { in_->Quiesce(); }
  void Resume() override { in_->Resume(); }
  void Prepare() override { in_->Prepare(); }

  // The stage's layout: the input's next index, then the input.
  void Save(StateWriter* w) override {
    SaveCounted(w, "shard", next_index_);
    in_->Save(w);
  }
  void Restore(StateReader* r) override {
    next_index_ = RestoreCounted(r, "shard", -1,
                                 fmt::format("Shard({}, {})", shards_, index_));
    in_->Restore(r);
  }

 private:
  std::unique_ptr<RecordStream> in_;
  const int64_t shards_;
  const int64_t index_;
  StageCounter* const counter_;  // "shard"
  int64_t next_index_ = 0;
  std::vector<RecordRef> read_;  // Take()'s
};

// What SampleStream and ChooseStream share, as the stages' MixIterator:
// the inputs, which of them have ended (MixEnds), and the stage's state
// layout (the ends, the picker's state, each input).  Pick() says which
// input gives the next record.  The picks count as the planner's work with
// its inputs' (a few ns a record: timing them apart would cost more than
// they do); the records the stream gives count as its stage's elements.
class MixStream : public RecordStream {
 public:
  MixStream(Env* env, const FusableStage& stage, std::string_view name,
            std::vector<std::unique_ptr<RecordStream>> in)
      : RecordStream(env),
        in_(std::move(in)),
        ends_(in_.size(), stage.stop_on_empty),
        counter_(env->ctx->Counter(stage.dataset, name)),
        name_(name) {}

  bool Next(RecordRef* out) override {
    const bool got =
        ends_.Next([this] { return Pick(); },
                   [this, out](size_t i) { return in_[i]->Next(out); },
                   [this] { InputsChanged(); });
    if (got) counter_->elements.fetch_add(1, std::memory_order_relaxed);
    return got;
  }

  void Quiesce() override {
    for (auto& in : in_) in->Quiesce();
  }
  void Resume() override {
    for (auto& in : in_) in->Resume();
  }

  void Save(StateWriter* w) override {
    ends_.SaveStage(
        w, name_, [this](StateWriter* pw) { SavePicker(pw); }, in_);
  }
  void Restore(StateReader* r) override {
    ends_.RestoreStage(
        r, name_, [this] { InputsChanged(); },
        [this](StateReader* pr) { RestorePicker(pr); }, in_);
  }

 protected:
  // The input of the next record; nullopt: the stream ends.  An exception
  // it throws is that record's error (the pick is used up).
  virtual std::optional<size_t> Pick() = 0;
  // After an input has ended or a Restore.
  virtual void InputsChanged() {}
  virtual void SavePicker(StateWriter* w) = 0;
  virtual void RestorePicker(StateReader* r) = 0;

  std::vector<std::unique_ptr<RecordStream>> in_;
  MixEnds ends_;
  StageCounter* const counter_;  // the stage's

 private:
  const std::string name_;  // the stage's
};

// SampleFromDatasets (its iterator over views): each record from the
// input its draw picks, with the stage's weights, seed and ends
// (WeightedDraws, MixEnds), so the same records in the same order.
// Take() hands its inputs runs of draws that pick the same input at once.
class SampleStream final : public MixStream {
 public:
  SampleStream(Env* env, const FusableStage& stage, uint64_t salt,
               std::vector<std::unique_ptr<RecordStream>> in)
      : MixStream(env, stage, "sample_from_datasets", std::move(in)),
        draws_(*stage.weights, stage.shuffle_seed(env->ctx, salt)) {}

  // Next() `n` times, where each run of draws that pick one input is
  // taken from it in one call: the draws ahead are known (Peek: the
  // generator is counter-based) while no input ends, and only a take can
  // end one.  An input that ends inside its run gave fewer records than
  // asked; the draw after them is Next()'s, which finds the input ended,
  // as the stage's draw does, and draws on.  An error uses up its draw.
  bool Take(size_t n, std::vector<RecordRef>* out) override {
    constexpr size_t kRun = 64;
    while (n > 0) {
      const std::optional<size_t> i =
          ends_.ended() ? std::nullopt : draws_.Peek(0);
      if (!i) return TakeByNext(this, n, out);  // ends as Next() ends
      const size_t most = std::min(n, kRun);
      size_t run = 1;
      while (run < most && draws_.Peek(run) == i) ++run;
      const size_t before = out->size();
      bool more;
      try {
        more = in_[*i]->Take(run, out);
      } catch (...) {
        Drew(out->size() - before, 1);
        throw;
      }
      const size_t got = out->size() - before;
      Drew(got, 0);
      n -= got;
      if (!more && n > 0) {  // the input ended inside the run
        if (!TakeByNext(this, 1, out)) return false;
        --n;
      }
    }
    return true;
  }

  // An input of weight 0 is never read.
  void Prepare() override {
    for (size_t i = 0; i < in_.size(); ++i) {
      if (draws_.weight(i) > 0) in_[i]->Prepare();
    }
  }

 private:
  std::optional<size_t> Pick() override { return draws_.Pick(); }
  void InputsChanged() override { draws_.SetEnded(ends_.input_ended()); }
  void SavePicker(StateWriter* w) override { w->U64(draws_.state()); }
  void RestorePicker(StateReader* r) override { draws_.set_state(r->U64()); }

  // `records` taken from the input a run of draws picked, and `spent`
  // draws more (an error's).
  void Drew(size_t records, uint64_t spent) {
    draws_.Skip(records + spent);
    counter_->elements.fetch_add(records, std::memory_order_relaxed);
  }

  WeightedDraws draws_;
};

// ChooseFromDatasets (its iterator over views): each record from the
// input the next element of the choice dataset names (ChoicePicker), so
// the same records in the same order.  The choice dataset is not fused:
// its own iterator, made with the stream's salt as the stage's is, runs
// on the planner's thread (the consumer's, unless SetPlanInTask(1)), a
// choice a record.
class ChooseStream final : public MixStream {
 public:
  ChooseStream(Env* env, const FusableStage& stage, uint64_t salt,
               std::vector<std::unique_ptr<RecordStream>> in)
      : MixStream(env, stage, "choose_from_datasets", std::move(in)),
        picker_(stage.choices->MakeIterator(env->ctx, salt), in_.size()) {}

  // Which inputs the choices will name is not known ahead: each reads
  // ahead.
  void Prepare() override {
    for (auto& in : in_) in->Prepare();
  }

 private:
  std::optional<size_t> Pick() override { return picker_.Pick(); }
  void SavePicker(StateWriter* w) override { picker_.Save(w); }
  void RestorePicker(StateReader* r) override { picker_.Restore(r); }

  ChoicePicker picker_;
};

// Makes the stream of chain[i..] (chain.back() is the source, or a
// mixture of the chains below it) for `salt`.
std::unique_ptr<RecordStream> MakeStream(Env* env,
                                         const std::vector<FusableStage>& chain,
                                         size_t i, uint64_t salt) {
  const FusableStage& s = chain[i];
  switch (s.kind) {
    case FusableStage::Kind::kTFRecord:
      return std::make_unique<SourceStream>(env, s, salt);
    case FusableStage::Kind::kGlobalShuffle:
      return std::make_unique<GlobalShuffleStream>(env, s, salt);
    case FusableStage::Kind::kShuffle:
      return std::make_unique<ShuffleStream>(
          env, s, salt, MakeStream(env, chain, i + 1, salt));
    case FusableStage::Kind::kRepeat:
      return std::make_unique<RepeatStream>(
          env, s, salt, [env, &chain, i](uint64_t epoch_salt) {
            return MakeStream(env, chain, i + 1, epoch_salt);
          });
    case FusableStage::Kind::kTake:
    case FusableStage::Kind::kSkip:
      return std::make_unique<CountStream>(env, s,
                                           MakeStream(env, chain, i + 1, salt));
    case FusableStage::Kind::kShard:
      return std::make_unique<ShardStream>(env, s,
                                           MakeStream(env, chain, i + 1, salt));
    case FusableStage::Kind::kSample:
    case FusableStage::Kind::kChoose: {
      // Each input gets the salt (as the stage's iterators do).
      std::vector<std::unique_ptr<RecordStream>> in;
      for (const auto& input : s.chains) {
        in.push_back(MakeStream(env, input, 0, salt));
      }
      if (s.kind == FusableStage::Kind::kChoose) {
        return std::make_unique<ChooseStream>(env, s, salt, std::move(in));
      }
      return std::make_unique<SampleStream>(env, s, salt, std::move(in));
    }
    case FusableStage::Kind::kBatch:
      break;
  }
  throw Error("batch-parse fusion: a Batch below the fused Batch");
}

// The sources of `chain` and of the chains below its mixtures, each time
// one is met (a dataset a mixture takes twice is read twice).
void CollectSources(const std::vector<FusableStage>& chain,
                    std::vector<const FusableStage*>* out) {
  for (const FusableStage& s : chain) {
    if (s.kind == FusableStage::Kind::kSample ||
        s.kind == FusableStage::Kind::kChoose) {
      for (const auto& input : s.chains) CollectSources(input, out);
    } else if (s.kind == FusableStage::Kind::kTFRecord ||
               s.kind == FusableStage::Kind::kGlobalShuffle) {
      out->push_back(&s);
    }
  }
}

class FusedBatchParse final : public IteratorBase {
 public:
  FusedBatchParse(IteratorContext* ctx, const DatasetBase& parse_stage,
                  const ParseInfo& info, int calls, FusableStage batch,
                  std::vector<FusableStage> chain, uint64_t salt)
      : ctx_(ctx),
        info_(info),
        calls_(calls),
        batch_(std::move(batch)),
        chain_(std::move(chain)),
        max_slots_(kBatchesAhead * static_cast<size_t>(calls) + 1),
        plan_in_task_(PlanInTask(calls)),
        plan_burst_(std::max<size_t>(1, static_cast<size_t>(calls) / 4)),
        arena_(FusedWorkers(ctx->threads(), plan_in_task_), 0) {
    last_fused_workers.store(arena_.max_concurrency(),
                             std::memory_order_relaxed);
    std::vector<const FusableStage*> sources;
    CollectSources(chain_, &sources);
    env_.ctx = ctx;
    env_.arena = &arena_;
    // One parse call reads ahead too where files are read in parallel (as
    // the stages do, FileReadAhead; as tf.data's interleave does whatever
    // the map's parallelism): else gzipped files decode at one core's
    // speed however many are read at once.
    env_.read_ahead = calls > 1;
    int64_t files_at_once = 0;
    for (const FusableStage* source : sources) {
      if (source->tfrecord != nullptr) {
        env_.read_ahead = env_.read_ahead || ReadsFilesAhead(*source->tfrecord);
        files_at_once +=
            std::min<int64_t>(source->tfrecord->num_parallel_reads,
                              static_cast<int64_t>(source->paths->size()));
      }
    }
    env_.help_read = env_.read_ahead && !plan_in_task_;
    env_.threads = static_cast<size_t>(ctx->threads());
    // Every source's files, each source's once, in the order they are
    // met (a global shuffle's too: the parse calls read its records, as
    // many at once).
    for (const FusableStage* source : sources) {
      if (source->kind == FusableStage::Kind::kGlobalShuffle) {
        if (env_.globals.contains(source->dataset)) continue;
        GlobalFiles& g = env_.globals[source->dataset];
        g.source = source->global;
        g.first_file = paths_.size();
        g.counter = ctx->Counter(source->dataset, "global_shuffle", calls);
        paths_.insert(paths_.end(), g.source->paths.begin(),
                      g.source->paths.end());
        continue;
      }
      if (env_.sources.contains(source->dataset)) continue;
      env_.sources[source->dataset] = {
          .options = source->tfrecord,
          .first_file = paths_.size(),
          .counter = ctx->Counter(source->dataset, "tfrecord",
                                  env_.read_ahead ? ctx->threads() : 1)};
      paths_.insert(paths_.end(), source->paths->begin(), source->paths->end());
    }
    env_.paths = &paths_;
    for (auto& [stage, g] : env_.globals) {
      g.unread =
          std::make_unique<UnreadFiles>(g.source, paths_.data() + g.first_file);
    }
    if (!env_.sources.empty()) {
      env_.chunk_records = ChunkRecords(files_at_once);
      env_.chunk_bytes = ChunkBytes(env_.chunk_records);
      if (!env_.read_ahead) {
        env_.chunk_bytes = std::min(env_.chunk_bytes, kOneThreadChunkBytes);
      }
      // Fewer files read at once than threads: the files with an index
      // are read by ranges, so that each file is read on several (not
      // where each file is shuffled: FileReader).
      if (env_.read_ahead && files_at_once < ctx->threads()) {
        env_.ranges = &TheRangeIndexes();
      }
    }
    env_.origin_files =
        std::make_shared<const BatchOrigins::Files>(*env_.paths);
    if (calls > 1) {
      env_.ledger.Discard(true);  // the parse tasks free the chunks
      env_.help = [this] {
        std::unique_lock<std::mutex> lock(mu_);
        if (to_parse_.empty() || stop_ || !QueuedPastFreeTasks()) return false;
        ParseQueued(lock);
        return true;
      };
    }
    plan_counter_ = ctx->Counter(batch_.dataset, "batch");
    env_.plan_counter = plan_counter_;
    parse_counter_ = ctx->Counter(&parse_stage, "parse", calls);
    stream_ = MakeStream(&env_, chain_, 0, salt);
    wake_up_id_ = ctx_->AddWakeUp([this] {
      std::lock_guard<std::mutex> lock(mu_);
      cv_.notify_all();
    });
  }

  ~FusedBatchParse() override {
    ctx_->RemoveWakeUp(wake_up_id_);
    {
      std::unique_lock<std::mutex> lock(mu_);
      stop_ = true;
      ++waiting_;
      cv_.wait(lock, [this] { return parse_tasks_ == 0 && !planning_; });
      --waiting_;
    }
    // The readers (in stream_) wait for their running tasks; the queued
    // ones end without them.
    stream_.reset();
    env_.WaitForNoReaderTasks();
  }

  bool GetNext(Element* out) override {
    if (!started_) {
      started_ = true;
      stream_->Resume();
    }
    if (calls_ == 1) return GetNextInline(out);
    if (!plan_in_task_) TopUp();
    std::unique_lock<std::mutex> lock(mu_);
    if (plan_in_task_) KickPlannerLocked();
    AwaitFrontLocked(lock);
    if (slots_.front()->end) return false;  // stays: later calls end too
    return TakeFrontLocked(lock, out);
  }

  void Save(StateWriter* w) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++waiting_;
      cv_.wait(lock, [this] {
        return !planning_ && to_parse_.empty() && parse_tasks_ == 0;
      });
      --waiting_;
    }
    env_.paused.store(true, std::memory_order_release);
    stream_->Quiesce();
    w->BeginStage("batch_parse");
    w->Bool(input_end_);
    w->U64(slots_.size());
    for (const auto& slot : slots_) {
      WriteResult(w, slot->end, slot->error, slot->element);
    }
    w->Bool(batch_end_);
    w->U64(pending_.size());
    for (const RecordRef& r : pending_) WriteView(w, env_, *r.view);
    stream_->Save(w);
    env_.paused.store(false, std::memory_order_release);
    if (started_) stream_->Resume();
  }

  // Each batch is copied in its parse task, right after parsing.
  bool DeliverIn(std::shared_ptr<Allocator> memory) override {
    if (started_) throw Error("DeliverIn: the stage is already running");
    output_memory_ = std::move(memory);
    return true;
  }

  // Before the first GetNext, so nothing else touches the buffers.
  void Restore(StateReader* r) override {
    if (started_) throw Error("cannot restore a running batch-parse stage");
    r->BeginStage("batch_parse");
    // A state saved with more parse calls holds more finished batches than
    // this iterator plans ahead; they are delivered before it plans again.
    slots_.clear();
    input_end_ = ReadResults(
        r, kMaxSavedBatches,
        [this](bool end, std::exception_ptr error, Element element) {
          auto slot = std::make_unique<Slot>();
          slot->ready = true;
          slot->end = end;
          slot->error = std::move(error);
          slot->element = std::move(element);
          if (output_memory_ && !slot->end && !slot->error) {
            slot->element.CopyInto(output_memory_);
          }
          slots_.push_back(std::move(slot));
        });
    batch_end_ = r->Bool();
    const uint64_t pending = r->U64();
    if (pending >= static_cast<uint64_t>(batch_.batch_size)) {
      r->Fail(fmt::format("{} pending records for batches of {}", pending,
                          batch_.batch_size));
    }
    env_.ledger.Retire(pending_);
    pending_.clear();
    std::vector<RecordView> views;
    ReferenceReader refs;
    for (uint64_t i = 0; i < pending; ++i) {
      views.push_back(ReadView(r, env_, &refs));
    }
    env_.ledger.AdoptLoose(std::move(views), &pending_);
    stream_->Restore(r);
  }

 private:
  struct Slot {
    // The batch's records, by reference until its parse task takes their
    // views; retired (ViewLedger) by the planner once the consumer took
    // the batch (RecycleTaken).
    std::vector<RecordRef> refs;
    Element element;
    std::exception_ptr error;
    bool end = false;
    bool ready = false;
  };

  // Batch's iterator over views: the next batch into *out, false at the
  // end.  Records of a batch that an error interrupted stay pending.
  bool Plan(std::vector<RecordRef>* out) {
    if (batch_end_) return false;
    const auto n = static_cast<size_t>(batch_.batch_size);
    pending_.reserve(n);
    if (pending_.size() < n && !stream_->Take(n - pending_.size(), &pending_)) {
      batch_end_ = true;
    }
    if (pending_.empty() ||
        (batch_end_ && batch_.drop_remainder && pending_.size() < n)) {
      env_.ledger.Retire(pending_);
      pending_.clear();
      return false;
    }
    out->swap(pending_);
    pending_.clear();
    return true;
  }

  // Plans the next batch into a fresh slot: its records, or its error, or
  // the end.
  std::unique_ptr<Slot> PlanSlot() {
    BusyScope busy(plan_counter_);
    RecycleTaken();
    std::unique_ptr<Slot> slot;
    if (spare_slots_.empty()) {
      slot = std::make_unique<Slot>();
    } else {
      slot = std::move(spare_slots_.back());
      spare_slots_.pop_back();
    }
    bool got = false;
    try {
      got = Plan(&slot->refs);
    } catch (...) {
      slot->error = std::current_exception();
    }
    if (got) {
      // (Its bytes are counted by the parse task, which reads the views.)
      plan_counter_->elements.fetch_add(1, std::memory_order_relaxed);
    } else {
      slot->end = !slot->error;
      slot->ready = true;
    }
    return slot;
  }

  // One parse call: planned and parsed on the consumer's thread, as an
  // unfused Map of one call runs, with no parse task; reader tasks read
  // ahead only where files are read in parallel (env_.read_ahead).
  bool GetNextInline(Element* out) {
    if (slots_.empty()) {
      if (input_end_) return false;
      auto slot = PlanSlot();
      if (slot->end) {
        input_end_ = true;
        slots_.push_back(std::move(slot));
      } else {
        if (!slot->ready) Parse(slot.get());
        slots_.push_back(std::move(slot));
      }
    }
    if (slots_.front()->end) return false;
    std::unique_lock<std::mutex> lock(mu_);
    return TakeFrontLocked(lock, out);
  }

  // The batch the consumer takes (the front slot, ready, not the end):
  // its error thrown or its element handed out, the batch before freed
  // with mu_ (held by `lock`) released.  The slot goes to taken_slots_,
  // for the planner to retire its refs (RecycleTaken); a planner task is
  // started if there is room for its burst.
  bool TakeFrontLocked(std::unique_lock<std::mutex>& lock, Element* out) {
    std::unique_ptr<Slot> taken = std::move(slots_.front());
    slots_.pop_front();
    std::exception_ptr error = std::move(taken->error);
    Element element;
    if (!error) element = std::move(taken->element);
    taken->element = Element{};
    taken->error = nullptr;
    taken->end = false;
    taken->ready = false;
    taken_slots_.push_back(std::move(taken));
    if (plan_in_task_) KickPlannerLocked();
    lock.unlock();
    if (error) std::rethrow_exception(error);
    *out = std::move(element);
    return true;
  }
  // The planner: retires the refs of the batches taken since it last
  // planned (every batch before them was taken too, so every parse task
  // that read their records' chunks is done; ViewLedger is the
  // planner's alone) and keeps their slots for the batches it plans (their
  // refs' capacity with them: no allocation a batch).
  void RecycleTaken() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (taken_slots_.empty()) return;
      recycling_.swap(taken_slots_);
    }
    for (std::unique_ptr<Slot>& slot : recycling_) {
      env_.ledger.Retire(slot->refs);
      slot->refs.clear();
      spare_slots_.push_back(std::move(slot));
    }
    recycling_.clear();
  }

  // Until the front slot is ready (waiting for the planner where none is
  // planned yet): parses the batch due here rather than sleep (as a
  // thread waiting in TBB runs tasks), or a queued one where that adds
  // parsing (QueuedPastFreeTasks).  Throws Cancelled.  mu_ held by `lock`.
  void AwaitFrontLocked(std::unique_lock<std::mutex>& lock) {
    const auto front_ready = [this] {
      return !slots_.empty() && slots_.front()->ready;
    };
    const auto front_queued = [this] {
      return !slots_.empty() && !to_parse_.empty() &&
             to_parse_.front() == slots_.front().get();
    };
    while (!front_ready()) {
      if (front_queued() ||
          (!slots_.empty() && !to_parse_.empty() && QueuedPastFreeTasks())) {
        ParseQueued(lock);
        continue;
      }
      if (ctx_->cancelled()) throw Cancelled();
      WaitScope wait(parse_counter_);
      ++waiting_;
      cv_.wait(lock, [&] {
        return front_ready() || front_queued() || ctx_->cancelled();
      });
      --waiting_;
    }
  }

  // Starts the planner task when room for plan_burst_ batches is free (or
  // none is planned), unless one runs.  A burst, not a batch: each start
  // may wake a sleeping worker, a system call on the consumer's thread.
  // mu_ held.
  void KickPlannerLocked() {
    if (planning_ || input_end_ || stop_) return;
    if (!slots_.empty() && slots_.size() + plan_burst_ > max_slots_) return;
    planning_ = true;
    arena_.enqueue([this] { PlanTask(); });
  }

  // The planner task: plans batches until kBatchesAhead per call are in
  // flight (one planner at a time: planning_).
  void PlanTask() {
    CounterNesting nesting(nesting_);  // the streams', where they were made
    // Ends before planning_ does (which the destructor waits for).
    std::optional<TaskRunning> running(std::in_place);
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_ && !input_end_ && slots_.size() < max_slots_) {
      lock.unlock();
      std::unique_ptr<Slot> slot = PlanSlot();
      lock.lock();
      QueueLocked(std::move(slot));
      if (waiting_ > 0) cv_.notify_all();
    }
    running.reset();
    planning_ = false;
    if (waiting_ > 0) cv_.notify_all();
  }

  // A planned slot into slots_ and, unless ready (the end or an error), to
  // the parse tasks.  mu_ held.
  void QueueLocked(std::unique_ptr<Slot> slot) {
    Slot* raw = slot.get();
    if (slot->end) input_end_ = true;
    slots_.push_back(std::move(slot));
    if (raw->ready) return;
    to_parse_.push_back(raw);
    // A task more only for batches the tasks free to take one (queued,
    // or between batches) will not reach next: each enqueue may wake a
    // sleeping worker, a system call on the planner's thread (the
    // consumer's, without a planner task: the one every batch waits
    // for); a task mid-batch reaches the next one only a batch's parse
    // later.
    if (parse_tasks_ < calls_ && QueuedPastFreeTasks()) {
      ++parse_tasks_;
      arena_.enqueue([this] { ParseTask(); });
    }
  }

  // Plans batches until kBatchesAhead per call are in flight, handing each
  // to the parse tasks.  The consumer's thread is the planner: planning a
  // batch moves views, a small part of the work (the "batch" stage in
  // Stats()).
  void TopUp() {
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (input_end_ || slots_.size() >= max_slots_) return;
      }
      std::unique_ptr<Slot> slot = PlanSlot();
      std::lock_guard<std::mutex> lock(mu_);
      QueueLocked(std::move(slot));
    }
  }

  // A parse task: parses queued batches until none is left.
  void ParseTask() {
    // Ends before parse_tasks_ does (which the destructor waits for).
    std::optional<TaskRunning> running(std::in_place);
    // Also when the consumer parsed every queued batch before this task
    // ran (then the queue frees itself only at kMaxDiscarded chunks).
    env_.ledger.FreeDiscarded();
    std::unique_lock<std::mutex> lock(mu_);
    while (!to_parse_.empty() && !stop_) ParseQueued(lock, true);
    running.reset();
    --parse_tasks_;
    if (waiting_ > 0) cv_.notify_all();
  }

  // Whether more batches are queued than parse tasks are free to take
  // them (queued, or between batches).  TopUp then adds a task, up to the
  // parse calls; and only then does the planner's thread (the
  // consumer's) parse a queued batch that is not the one due, while it
  // waits for that one or for a reader, so that its parsing adds to the
  // tasks'.  Else a task takes the batch as soon, and this
  // thread, the one every batch waits for, stays free to take the batch
  // due and plan the next (on 16 cores, parsing a later batch here,
  // ~70 us, kept the batch due and the planning waiting while workers
  // idled).  mu_ held.
  bool QueuedPastFreeTasks() const {
    return to_parse_.size() > static_cast<size_t>(parse_tasks_ - parsing_);
  }

  // Parses the oldest queued batch with mu_ (held by `lock`) released
  // meanwhile, and marks it ready.  A parse task (`task`) also frees the
  // chunks the planner is done with (ViewLedger::Discard).
  void ParseQueued(std::unique_lock<std::mutex>& lock, bool task = false) {
    Slot* slot = to_parse_.front();
    to_parse_.pop_front();
    if (task) ++parsing_;
    lock.unlock();
    Parse(slot);
    if (task) env_.ledger.FreeDiscarded();
    lock.lock();
    if (task) --parsing_;
    slot->ready = true;
    if (waiting_ > 0) cv_.notify_all();
  }

  // The batch's records straight into its tensors (read first, if the
  // global shuffle planned them).
  void Parse(Slot* slot) {
    // All of it parse's work but the global shuffle's reads (their own
    // scope): also where the consumer parses while the planner waits for
    // a reader (Env::help), which would else count as the planner's.
    BusyScope busy(parse_counter_);
    // The views, out of the chunks the planner's refs point into: where a
    // view owns its bytes (a shuffle's), moved here (the chunk's place is
    // left empty), so that its block goes with the batch; else only read
    // there (the chunk holds their bytes until the batch is taken).  The
    // global shuffles' views planned unread are copied, to be read into.
    const std::vector<RecordRef>& refs = slot->refs;
    std::vector<RecordView> records;  // held
    std::vector<RecordView> unread;   // read into
    std::vector<size_t> unread_rows;  // their rows
    std::vector<std::string_view> serialized(refs.size());
    std::vector<BatchOrigins::Row> rows(refs.size());
    uint64_t planned_bytes = 0;
    const auto origin = [&](size_t i, const RecordView& v) {
      serialized[i] = v.bytes();
      rows[i].offset = v.offset;
      rows[i].record = v.index;
      rows[i].file = static_cast<uint32_t>(env_.FileId(v));
    };
    // Shuffled, the views are all over the chunks: each asked for a few
    // records ahead, so that their cache misses overlap.
    constexpr size_t kAhead = 8;
    for (size_t i = 0; i < refs.size(); ++i) {
      if (i + kAhead < refs.size()) {
        const char* ahead =
            reinterpret_cast<const char*>(refs[i + kAhead].view);
        __builtin_prefetch(ahead, 1, 3);
        __builtin_prefetch(ahead + sizeof(RecordView) - 1, 1, 3);
      }
      RecordView& v = *refs[i].view;
      planned_bytes += v.size;
      if (v.unread) {  // its place and bytes once read
        if (unread.empty()) {
          unread.reserve(refs.size() - i);
          unread_rows.reserve(refs.size() - i);
        }
        unread.push_back(v);
        unread_rows.push_back(i);
        continue;
      }
      origin(i, v);  // the same bytes once moved
      if (v.owner != nullptr) {
        if (records.empty()) records.reserve(refs.size() - i);
        records.push_back(std::move(v));
      }
    }
    plan_counter_->bytes.fetch_add(planned_bytes, std::memory_order_relaxed);
    try {
      // Each global shuffle reads its own (a mixture may have several).
      for (auto& [stage, g] : env_.globals) {
        if (unread.empty()) break;
        BusyScope read_busy(g.counter);
        const auto [views, bytes] = g.unread->Read(&unread);
        g.counter->elements.fetch_add(views, std::memory_order_relaxed);
        g.counter->bytes.fetch_add(bytes, std::memory_order_relaxed);
      }
      for (size_t j = 0; j < unread.size(); ++j) {
        origin(unread_rows[j], unread[j]);
      }
    } catch (...) {
      slot->element = Element{};
      slot->error = std::current_exception();
      return;
    }
    try {
      // Shuffled records come from all over the buffered blocks: the
      // parser asks for each record's lines a few records ahead
      // (records/example_parser.cc, PrefetchExample).
      slot->element.batch_origins = std::make_shared<const BatchOrigins>(
          env_.origin_files, std::move(rows));
      ParseRecords(info_, serialized, true, &slot->element);
      if (info_.options.keep_record) {
        slot->element.components.push_back(
            {info_.options.record_key,
             Tensor::FromStrings(
                 serialized, Shape{static_cast<int64_t>(serialized.size())})});
      }
      // While the batch is in this core's cache (its parse buffers then go
      // back for the next batch).
      if (output_memory_) slot->element.CopyInto(output_memory_);
    } catch (...) {
      slot->element = Element{};
      slot->error = std::current_exception();
    }
    // `records` and `unread` go here: the read blocks they held go with
    // them.
  }

  IteratorContext* ctx_;
  const ParseInfo& info_;
  const int calls_;
  const FusableStage batch_;
  const std::vector<FusableStage> chain_;
  const size_t max_slots_;
  // Planning in a task of its own (SetPlanInTask(1); else on the
  // consumer's thread), and the batches it plans at least once started
  // (KickPlannerLocked).  The task also retires the refs of the batch
  // taken (on 16 cores, of the ~18 us the consumer's thread spent a
  // shuffled Fashion-MNIST batch, ~10 were planning and 2.3 retiring).
  const bool plan_in_task_;
  // Where this stage was made (an interleave's input: CounterNesting), for
  // the planner task, which may make the streams of later epochs.
  const CounterNesting::Frame nesting_ = CounterNesting::Current();
  const size_t plan_burst_;
  // Where the reader, parse and planner tasks run: its own workers
  // (FusedWorkers), from the process's pool as every arena's.  Its tasks
  // end before it goes (the destructor waits for them).
  tbb::task_arena arena_;
  // Every TFRecord source's files (Env::paths), kept while the streams
  // are.
  std::vector<std::shared_ptr<const std::string>> paths_;
  Env env_;
  StageCounter* plan_counter_;
  StageCounter* parse_counter_;
  uint64_t wake_up_id_;
  // IteratorOptions::output_memory (DeliverIn, before the first batch).
  std::shared_ptr<Allocator> output_memory_;

  // The planner's (the consumer's thread, or the planner task, one at a
  // time; the consumer's while none runs, as in Save).
  std::unique_ptr<RecordStream> stream_;
  std::vector<RecordRef> pending_;
  bool batch_end_ = false;
  bool started_ = false;
  // Slots retired, for PlanSlot to use again.
  std::vector<std::unique_ptr<Slot>> spare_slots_;
  std::vector<std::unique_ptr<Slot>> recycling_;  // RecycleTaken's

  // Shared with the parse tasks.  A slot's records and element belong to
  // the task that took it from to_parse_ until it is ready.
  std::mutex mu_;
  std::condition_variable cv_;
  int waiting_ = 0;  // threads in cv_.wait: tasks notify only then
  std::deque<std::unique_ptr<Slot>> slots_;
  std::deque<Slot*> to_parse_;
  int parse_tasks_ = 0;
  int parsing_ = 0;  // parse tasks at a batch (the rest queued or between)
  bool input_end_ = false;
  bool stop_ = false;
  bool planning_ = false;  // the planner task runs
  // Slots the consumer took, their refs not yet retired (RecycleTaken).
  std::vector<std::unique_ptr<Slot>> taken_slots_;

  // The batches in flight (the slots, the consumer's and one more
  // downstream, as a Prefetch's) keep their buffers for reuse while this
  // lives.  Last: let go before the slots go, so that what they give back
  // then beyond the others' holds is freed.
  const std::shared_ptr<void> buffers_held_ =
      HoldParsedBuffers(info_, max_slots_ + 2);
};

// The stages from `d` down to its source, each described (a mixture's
// inputs each as a chain of its own, in FusableStage::chains); false
// where one is not fused.
bool DescribeChain(DatasetPtr d, std::vector<FusableStage>* chain) {
  while (true) {
    FusableStage s;
    s.dataset = d.get();
    if (!d->DescribeForFusion(&s) || s.kind == FusableStage::Kind::kBatch) {
      return false;
    }
    if (s.kind == FusableStage::Kind::kSample ||
        s.kind == FusableStage::Kind::kChoose) {
      for (const DatasetPtr& input : s.inputs) {
        if (!DescribeChain(input, &s.chains.emplace_back())) {
          return false;
        }
      }
      chain->push_back(std::move(s));
      return true;
    }
    chain->push_back(s);
    if (s.kind == FusableStage::Kind::kTFRecord ||
        s.kind == FusableStage::Kind::kGlobalShuffle) {
      return true;
    }
    d = s.input;
  }
}

}  // namespace

uint64_t FusedRangesRead() { return FileReader::RangesRead(); }
uint64_t FusedFileReadersMade() { return FileReader::Made(); }

void SetMinRangedFileBytes(uint64_t bytes) {
  min_file_bytes.store(bytes == 0 ? kMinRangedFileBytes : bytes,
                       std::memory_order_relaxed);
}
void SetFusedCores(int cores) {
  fused_cores.store(std::max(cores, 0), std::memory_order_relaxed);
}
void SetPlanInTask(int mode) {
  plan_in_task.store(std::clamp(mode, -1, 1), std::memory_order_relaxed);
}
int TakeFusedTasksAtOnceMost() {
  return tasks_running_most.exchange(0, std::memory_order_relaxed);
}
int LastFusedWorkers() {
  return last_fused_workers.load(std::memory_order_relaxed);
}
uint64_t PlannerHelpReads() {
  return planner_help_reads.load(std::memory_order_relaxed);
}

std::unique_ptr<IteratorBase> MakeFusedBatchParse(
    const DatasetBase& parse, const DatasetPtr& input, const ParseInfo& info,
    int parallel_calls, IteratorContext* ctx, uint64_t salt) {
  if (!ctx->optimize() || info.options.record_key != "record") return nullptr;
  FusableStage batch;
  batch.dataset = input.get();
  if (!input->DescribeForFusion(&batch) ||
      batch.kind != FusableStage::Kind::kBatch) {
    return nullptr;
  }
  std::vector<FusableStage> chain;
  if (!DescribeChain(batch.input, &chain)) return nullptr;
  return std::make_unique<FusedBatchParse>(
      ctx, parse, info, std::max(parallel_calls, 1), std::move(batch),
      std::move(chain), salt);
}

}  // namespace recflow::pipeline::stages
