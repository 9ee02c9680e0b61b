/*
 * TensorLights SPANK plugin: lets a user say which tasks of a job step are parameter servers,
 * in Slurm's own words, so the TensorLights agent on each node can believe it.
 *
 *   srun   --tensorlights-ps-tasks=0,4-5 ...     the step's tasks 0, 4 and 5 are PS
 *   sbatch --tensorlights-ps-tasks=0 job.sh      every srun step inside the job inherits it
 *
 * In slurmstepd (root) it writes, before any task starts, a record the job's user cannot
 * write:
 *
 *   <dir>/job_<JOBID>/step_<STEPID>   {"job":123,"step":"0","uid":1000,"ntasks":8,"ps_tasks":[0,4,5]}
 *
 * and removes it when the step ends. The agent (setting `slurm_spank_dir`, default
 * /run/tensorlights/slurm) reads the record of the step a task's cgroup names and makes the
 * listed tasks (SLURM_PROCID, the step's global task id) its PS: no agent configuration, no
 * variable the user could set on another job's behalf. Only real steps get a record (not
 * the batch script or the extern step, which are no tasks of the training job).
 *
 * plugstack.conf:   required /usr/lib/x86_64-linux-gnu/slurm-wlm/tensorlights_spank.so [dir=PATH]
 *
 * Build: make -C deploy/slurm (needs the distribution's libslurm-dev for <slurm/spank.h>).
 */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

SPANK_PLUGIN(tensorlights, 1);

#define OPTION "tensorlights-ps-tasks"
#define DEFAULT_DIR "/run/tensorlights/slurm"
#define MAX_TASK_ID 1000000 /* far above any step's task count; bounds a range like 0-4e9 */

static char *ps_tasks = NULL; /* the option's value as given, validated */
/* Sized so that every path built from them fits in PATH_MAX. */
static char record_dir[PATH_MAX - 128] = DEFAULT_DIR;
static char record_path[PATH_MAX] = "";
static char job_path[PATH_MAX - 64] = "";

/* Calls `visit(id, data)` for every task id in LIST ("0", "0,3", "2-5,8"); 0 when LIST is
 * well formed and every visit returned 0. */
static int each_task(const char *list, int (*visit)(unsigned long, void *), void *data)
{
    const char *p = list;
    if (*p == '\0')
        return -1;
    for (;;) {
        char *end;
        unsigned long first, last;
        if (*p < '0' || *p > '9')
            return -1;
        errno = 0;
        first = strtoul(p, &end, 10);
        if (errno || first > MAX_TASK_ID)
            return -1;
        last = first;
        if (*end == '-') {
            p = end + 1;
            if (*p < '0' || *p > '9')
                return -1;
            last = strtoul(p, &end, 10);
            if (errno || last > MAX_TASK_ID || last < first)
                return -1;
        }
        if (visit != NULL)
            for (unsigned long id = first; id <= last; id++)
                if (visit(id, data) != 0)
                    return -1;
        if (*end == '\0')
            return 0;
        if (*end != ',')
            return -1;
        p = end + 1;
    }
}

static int take_option(int val, const char *optarg, int remote)
{
    (void)val;
    (void)remote;
    if (optarg == NULL || each_task(optarg, NULL, NULL) != 0) {
        slurm_error("--%s=%s: expected task ids such as 0 or 0,3 or 0-3,8", OPTION,
                    optarg ? optarg : "");
        return -1;
    }
    free(ps_tasks);
    ps_tasks = strdup(optarg);
    return ps_tasks == NULL ? -1 : 0;
}

static struct spank_option option = {
    OPTION, "LIST",
    "TensorLights: the tasks (global task ids, e.g. 0 or 0,4-5) that are the job's parameter "
    "servers; the TensorLights agent on each node gives their traffic the job's band",
    1, 0, take_option,
};

/* The plugstack.conf arguments; every entry point that needs them reads them (slurmd's job
 * epilog calls no slurm_spank_init first). */
static int take_args(int ac, char **av)
{
    for (int i = 0; i < ac; i++) {
        if (strncmp(av[i], "dir=", 4) == 0 && av[i][4] == '/' &&
            strlen(av[i] + 4) < sizeof(record_dir)) {
            strcpy(record_dir, av[i] + 4);
        } else {
            slurm_error("tensorlights: unknown or bad plugstack argument '%s' (known: dir=/PATH)",
                        av[i]);
            return -1;
        }
    }
    return 0;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    if (take_args(ac, av) != 0)
        return -1;
    /* Registered in every context: srun and sbatch/salloc show it in --help and accept it;
     * slurmstepd receives its value. */
    if (spank_option_register(sp, &option) != ESPANK_SUCCESS) {
        slurm_error("tensorlights: cannot register --%s", OPTION);
        return -1;
    }
    return 0;
}

struct json_out {
    char *buf;
    size_t len, size;
    unsigned long ntasks;
    int count;
};

static int append_id(unsigned long id, void *data)
{
    struct json_out *out = data;
    int n;
    if (id >= out->ntasks) {
        slurm_error("tensorlights: --%s=%s names task %lu, but the step has %lu tasks (0-%lu)",
                    OPTION, ps_tasks, id, out->ntasks, out->ntasks - 1);
        return -1;
    }
    n = snprintf(out->buf + out->len, out->size - out->len, "%s%lu", out->count ? "," : "", id);
    if (n < 0 || (size_t)n >= out->size - out->len) {
        slurm_error("tensorlights: --%s=%s is too long", OPTION, ps_tasks);
        return -1;
    }
    out->len += (size_t)n;
    out->count++;
    return 0;
}

/* mkdir that accepts an existing directory only if it is a real one owned by root and
 * writable by root alone: the agent believes what is under it. */
static int root_only_dir(const char *path)
{
    struct stat st;
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        slurm_error("tensorlights: mkdir %s: %s", path, strerror(errno));
        return -1;
    }
    if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != 0 ||
        (st.st_mode & 022)) {
        slurm_error("tensorlights: %s must be a directory owned by root and writable by root "
                    "alone", path);
        return -1;
    }
    return 0;
}

static int make_parents(const char *dir)
{
    char path[PATH_MAX];
    strcpy(path, dir);
    for (char *slash = strchr(path + 1, '/'); slash != NULL; slash = strchr(slash + 1, '/')) {
        *slash = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST) {
            slurm_error("tensorlights: mkdir %s: %s", path, strerror(errno));
            return -1;
        }
        *slash = '/';
    }
    return root_only_dir(path);
}

static int write_record(uint32_t job, uint32_t step, uid_t uid, uint32_t ntasks)
{
    char ids[65536];
    char text[sizeof(ids) + 256];
    char tmp[PATH_MAX];
    struct json_out out = {ids, 0, sizeof(ids), ntasks, 0};
    int fd, n;
    ssize_t written;

    ids[0] = '\0';
    if (each_task(ps_tasks, append_id, &out) != 0)
        return -1;
    if (make_parents(record_dir) != 0)
        return -1;
    snprintf(job_path, sizeof(job_path), "%s/job_%u", record_dir, job);
    if (root_only_dir(job_path) != 0)
        return -1;
    snprintf(record_path, sizeof(record_path), "%s/step_%u", job_path, step);
    snprintf(tmp, sizeof(tmp), "%s/.step_%u.%ld", job_path, step, (long)getpid());
    n = snprintf(text, sizeof(text),
                 "{\"job\":%u,\"step\":\"%u\",\"uid\":%u,\"ntasks\":%u,\"ps_tasks\":[%s]}\n",
                 job, step, (unsigned)uid, ntasks, ids);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        slurm_error("tensorlights: open %s: %s", tmp, strerror(errno));
        return -1;
    }
    written = write(fd, text, (size_t)n);
    if (written != n || fsync(fd) != 0 || close(fd) != 0 || rename(tmp, record_path) != 0) {
        slurm_error("tensorlights: writing %s: %s", record_path, strerror(errno));
        unlink(tmp);
        record_path[0] = '\0';
        return -1;
    }
    return 0;
}

static int check_id(unsigned long id, void *data)
{
    unsigned long ntasks = *(uint32_t *)data;
    if (id < ntasks)
        return 0;
    slurm_error("--%s=%s names task %lu, but the step has %lu tasks (0-%lu)", OPTION, ps_tasks,
                id, ntasks, ntasks - 1);
    return -1;
}

/* srun, before it launches the step: a task id past the step's tasks is the user's mistake,
 * said on the user's terminal (slurmstepd's errors only reach slurmd's log). */
int slurm_spank_local_user_init(spank_t sp, int ac, char **av)
{
    uint32_t ntasks;
    (void)ac;
    (void)av;
    if (ps_tasks == NULL)
        return 0;
    if (spank_get_item(sp, S_JOB_TOTAL_TASK_COUNT, &ntasks) != ESPANK_SUCCESS) {
        slurm_error("tensorlights: cannot read the step's task count");
        return -1;
    }
    return each_task(ps_tasks, check_id, &ntasks);
}

/* slurmstepd, as root, after the options were processed and before any task is forked. */
int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
    uint32_t job, step, ntasks;
    uid_t uid;
    (void)ac;
    (void)av;
    if (!spank_remote(sp) || ps_tasks == NULL)
        return 0;
    if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_TOTAL_TASK_COUNT, &ntasks) != ESPANK_SUCCESS) {
        slurm_error("tensorlights: cannot read the job step's ids");
        return -1;
    }
    if (step >= SLURM_MAX_NORMAL_STEP_ID)
        return 0; /* the batch script, the extern or an interactive step: no training tasks */
    return write_record(job, step, uid, ntasks);
}

/* slurmd, as root, when the job ends on this node: whatever a step could not remove (its
 * slurmstepd was killed) goes with the job, so a later job with a reused id finds nothing. */
int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
    uint32_t job;
    DIR *dir;
    struct dirent *entry;
    const char *id = getenv("SLURM_JOB_ID"); /* what the epilog's environment names */
    char *end;
    (void)sp;
    if (take_args(ac, av) != 0)
        return -1;
    if (id == NULL || *id == '\0' || (job = strtoul(id, &end, 10), *end != '\0')) {
        slurm_error("tensorlights: the job epilog has no SLURM_JOB_ID");
        return 0;
    }
    snprintf(job_path, sizeof(job_path), "%s/job_%u", record_dir, job);
    dir = opendir(job_path);
    if (dir == NULL)
        return 0;
    while ((entry = readdir(dir)) != NULL) {
        if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0)
            continue;
        if (unlinkat(dirfd(dir), entry->d_name, 0) != 0 && errno != ENOENT)
            slurm_error("tensorlights: unlink %s/%s: %s", job_path, entry->d_name,
                        strerror(errno));
    }
    closedir(dir);
    if (rmdir(job_path) != 0 && errno != ENOENT)
        slurm_error("tensorlights: rmdir %s: %s", job_path, strerror(errno));
    return 0;
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    if (spank_remote(sp) && record_path[0] != '\0') {
        if (unlink(record_path) != 0 && errno != ENOENT)
            slurm_error("tensorlights: unlink %s: %s", record_path, strerror(errno));
        rmdir(job_path); /* fails while another step of the job still has its record */
    }
    free(ps_tasks);
    ps_tasks = NULL;
    return 0;
}
