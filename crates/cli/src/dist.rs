//! The processes a `train` command runs in: the ranks of an `mpirun` job (cargo feature
//! `mpi`, docs/DISTRIBUTED.md), or this process alone.

use anyhow::Result;
use transformer_train::dist::Dist;

/// Whether this process was started by an MPI launcher (`mpirun`, `srun`) as one of several.
pub(crate) fn launched_with_several() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"]
        .iter()
        .any(|k| std::env::var(k).ok().and_then(|v| v.parse::<usize>().ok()) > Some(1))
}

/// Refuses a command that runs in one process (`command`, as `mt translate`) when it was
/// started as one of several ranks: every rank would do the whole work and write the whole
/// output.
pub(crate) fn refuse_several(command: &str) -> Result<()> {
    anyhow::ensure!(
        !launched_with_several(),
        "{command} runs in one process: start it without mpirun or srun (as one of several \
         ranks, every rank would translate the whole input and print it again); only \
         training is data-parallel"
    );
    Ok(())
}

/// The processes of a training run, held for its whole life (MPI is finalized when dropped).
pub struct Processes {
    #[cfg(feature = "mpi")]
    universe: Option<mpi::environment::Universe>,
    /// What the training loop sums across and checks with.
    pub dist: Dist,
}

impl Processes {
    /// Joins the MPI job this process was started in, or trains alone. Without the `mpi`
    /// feature, a process started as one of several is an error (each would train its own
    /// copy of the run into the same directory).
    pub fn start() -> Result<Self> {
        #[cfg(feature = "mpi")]
        {
            if launched_with_several() {
                use mpi::traits::Communicator;
                let universe = mpi::initialize()
                    .ok_or_else(|| anyhow::anyhow!("MPI was initialized twice"))?;
                let world = universe.world();
                let dist = Dist::new(std::rc::Rc::new(MpiWorld {
                    rank: world.rank() as usize,
                    size: world.size() as usize,
                    world,
                }));
                return Ok(Self {
                    universe: Some(universe),
                    dist,
                });
            }
            Ok(Self {
                universe: None,
                dist: Dist::single(),
            })
        }
        #[cfg(not(feature = "mpi"))]
        {
            anyhow::ensure!(
                !launched_with_several(),
                "this process was started by an MPI launcher as one of several, but this \
                 `transformer` was built without MPI: build it with `cargo build --release -p \
                 transformer-cli --features mpi` (docs/DISTRIBUTED.md)"
            );
            Ok(Self {
                dist: Dist::single(),
            })
        }
    }

    /// Ends the job on an error: alone, returns it; in an MPI job with several ranks, prints
    /// it with this rank's number and aborts every rank (the others may be waiting for this
    /// one in a sum, and would otherwise wait forever).
    pub fn finish(self, r: Result<()>) -> Result<()> {
        #[cfg(feature = "mpi")]
        if let (Err(e), Some(universe)) = (&r, &self.universe) {
            use mpi::traits::Communicator;
            if self.dist.size() > 1 {
                eprintln!(
                    "error: rank {} of {}: {e:#}; aborting every rank",
                    self.dist.rank(),
                    self.dist.size()
                );
                universe.world().abort(1);
            }
        }
        r
    }
}

/// The ranks of an MPI job's world communicator.
#[cfg(feature = "mpi")]
struct MpiWorld {
    world: mpi::topology::SimpleCommunicator,
    rank: usize,
    size: usize,
}

#[cfg(feature = "mpi")]
impl transformer_train::dist::Collective for MpiWorld {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn sum_f32(&self, buf: &mut [f32]) {
        use mpi::collective::{CommunicatorCollectives, SystemOperation};
        let send = buf.to_vec();
        self.world
            .all_reduce_into(&send[..], buf, SystemOperation::sum());
    }
    fn sum_f64(&self, buf: &mut [f64]) {
        use mpi::collective::{CommunicatorCollectives, SystemOperation};
        let send = buf.to_vec();
        self.world
            .all_reduce_into(&send[..], buf, SystemOperation::sum());
    }
    fn gather_u64(&self, value: u64) -> Vec<u64> {
        use mpi::collective::CommunicatorCollectives;
        let mut all = vec![0u64; self.size];
        self.world.all_gather_into(&value, &mut all[..]);
        all
    }
    fn gather_bytes(&self, bytes: &[u8]) -> Vec<Vec<u8>> {
        use mpi::collective::CommunicatorCollectives;
        use mpi::datatype::PartitionMut;
        let mut counts = vec![0 as mpi::Count; self.size];
        self.world
            .all_gather_into(&(bytes.len() as mpi::Count), &mut counts[..]);
        let displs: Vec<mpi::Count> = counts
            .iter()
            .scan(0, |acc, &c| {
                let d = *acc;
                *acc += c;
                Some(d)
            })
            .collect();
        let total: usize = counts.iter().map(|&c| c as usize).sum();
        let mut buf = vec![0u8; total];
        {
            let mut part = PartitionMut::new(&mut buf[..], &counts[..], &displs[..]);
            self.world.all_gather_varcount_into(bytes, &mut part);
        }
        counts
            .iter()
            .zip(&displs)
            .map(|(&c, &d)| buf[d as usize..(d + c) as usize].to_vec())
            .collect()
    }
}
