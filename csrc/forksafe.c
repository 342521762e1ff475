/* guard_fork(): makes os.fork() safe from CPython gh-112275 on the interpreters that have it.

   The interpreter's list of thread states is guarded by one lock (HEAD_LOCK). A native thread
   that calls into Python without a thread state of its own (PyGILState_Ensure: gloo's threads
   freeing a collective's tensors, a ctypes callback) creates one under that lock *before* it
   takes the GIL, so the lock can be held by such a thread while the main thread forks. On 3.10
   and 3.11 before the fix (3.10.15, 3.11.10), the child's PyOS_AfterFork_Child takes that lock
   to drop the other threads' states before it re-creates it: the child then waits forever,
   inside os.fork(), for a thread that does not exist in it. A DataLoader worker forked at that
   moment never starts, and the training process waits for its first batch.

   The fix upstream re-creates the runtime's locks before that use. HEAD_LOCK is the one of them
   a thread takes without the GIL (the forking thread holds the GIL, which keeps the others
   free), and this file re-creates it from a pthread_atfork child handler, which runs inside
   fork() itself, before the interpreter's own after-fork code. It swaps in a new lock, as
   CPython's _PyThread_at_fork_reinit does (the old one is left alone, its state unknown),
   allocated with the default raw allocator, as CPython's own re-creation is (a tracing
   allocator's hook would need the GIL). On fixed releases the interpreter re-creates the lock
   once more: harmless. Python 3.12 and later take the lock only after re-creating it; nothing
   is installed there.

   This reads the interpreter's internal runtime state, whose layout is fixed within a minor
   version; the handler is installed only if that layout checks against public calls here. */

#include <patchlevel.h>
#if PY_VERSION_HEX >= 0x030A0000 && PY_VERSION_HEX < 0x030C0000 && !defined(_WIN32) /* no fork on Windows */
#define FASTDATA_FORK_FIX 1
#define Py_BUILD_CORE 1 /* for the runtime state's layout, below */
#endif
#include <Python.h>

#ifdef FASTDATA_FORK_FIX
#include <pthread.h>

#include "internal/pycore_pymem.h"
#include "internal/pycore_runtime.h"

static void reset_head_lock(void) {
  PyMemAllocatorEx old;
  _PyMem_SetDefaultAllocator(PYMEM_DOMAIN_RAW, &old);
  (void)_PyThread_at_fork_reinit(&_PyRuntime.interpreters.mutex); /* on failure: as without the fix */
  PyMem_SetAllocator(PYMEM_DOMAIN_RAW, &old);
}

/* 1: the handler is installed (now or by an earlier call); -1: the layout did not check, nothing
   installed. Called with the GIL held, which serialises the calls. */
int fastdata_guard_fork(void) {
  static int state = 0;
  if (state == 0) {
    int fits = _PyRuntime.interpreters.main == PyInterpreterState_Main() &&
               _PyRuntime.interpreters.mutex != NULL;
    state = fits && pthread_atfork(NULL, NULL, reset_head_lock) == 0 ? 1 : -1;
  }
  return state;
}
#else
/* 0: this interpreter needs no handler. */
int fastdata_guard_fork(void) { return 0; }
#endif
