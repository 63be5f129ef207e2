// Threads that build the HTTP API's unary responses for the engine: when a
// non-streamed completion's last prompt finishes, the engine thread posts the
// call here and goes on with its next step, and one of these threads renders
// its JSON (every choice's text and logprobs: a hundred megabytes for a
// thousand prompts with logprobs) and hands it to the connection; so is a
// scrape of GET /metrics, off the connection's I/O thread. Streamed
// events are rendered on the connections' I/O threads instead
// (HttpExchange::WriteRendered).
//
// Thread-safe.
#ifndef SWITCHSERVE_SERVER_HTTP_RENDER_THREADS_H_
#define SWITCHSERVE_SERVER_HTTP_RENDER_THREADS_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace switchserve {

class RenderThreads {
 public:
  // Starts `threads` (>= 1) threads, named `http-render`.
  explicit RenderThreads(int threads);
  // Stop().
  ~RenderThreads();
  RenderThreads(const RenderThreads&) = delete;
  RenderThreads& operator=(const RenderThreads&) = delete;

  // `work` runs once on one of the threads; work is started in the order it
  // was posted. After Stop, on the calling thread.
  void Post(std::function<void()> work);

  // Runs what is posted until nothing is left, then joins the threads.
  // Idempotent.
  void Stop();

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_HTTP_RENDER_THREADS_H_
