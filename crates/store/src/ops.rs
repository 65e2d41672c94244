//! The operations of NASD Tables 1–3 on the store.

use super::*;

impl Meta {
    pub(crate) fn partition(&self, p: u64) -> Result<&Partition, StoreError> {
        self.partitions.get(&p).ok_or(StoreError::NoSuchPartition(p))
    }
    pub(crate) fn partition_mut(&mut self, p: u64) -> Result<&mut Partition, StoreError> {
        self.partitions.get_mut(&p).ok_or(StoreError::NoSuchPartition(p))
    }
    pub(crate) fn object(&self, p: u64, o: u64) -> Result<&Object, StoreError> {
        self.partition(p)?.objects.get(&o).ok_or(StoreError::NoSuchObject { partition: p, object: o })
    }
    pub(crate) fn object_mut(&mut self, p: u64, o: u64) -> Result<&mut Object, StoreError> {
        self.partition_mut(p)?.objects.get_mut(&o).ok_or(StoreError::NoSuchObject { partition: p, object: o })
    }

    /// Drops one reference to a physical block of partition `p`.
    pub(crate) fn deref_block(&mut self, p: u64, phys: u64) {
        let c = self.refcount.get_mut(&phys).expect("reference to an unreferenced block");
        *c -= 1;
        if *c == 0 {
            self.refcount.remove(&phys);
            self.partitions.get_mut(&p).expect("partition of a referenced block").physical_blocks -= 1;
            self.release_block(phys);
        }
    }

    /// Returns an unreferenced block to free space: at once if no durable index
    /// can reference it, otherwise after the next commit — and in either case
    /// not before its last pin goes ([`Meta::free_block`]).
    fn release_block(&mut self, phys: u64) {
        if self.fresh.remove(&phys) {
            self.free_block(phys);
        } else {
            self.pending_free.push(phys);
        }
    }

    /// Frees a block no index, undo or durable index references: it waits
    /// in `to_punch` for [`Store::punch_freed`] to give its bytes back to the
    /// file system and hand it to the allocator — unless a reader has it
    /// pinned: then it waits in `pinned_free` for [`Meta::unpin`] first, so
    /// a reader never sees its bytes punched or replaced by a later write's.
    pub(crate) fn free_block(&mut self, phys: u64) {
        assert!(!self.refcount.contains_key(&phys), "freeing referenced block {phys}");
        if self.pins.contains_key(&phys) {
            let first = self.pinned_free.insert(phys);
            assert!(first, "pinned block {phys} freed twice");
        } else {
            self.to_punch.push(phys);
        }
    }

    /// Pins a referenced block for a reader that will read it without the
    /// object's lock: it is not reused until unpinned, whatever changes the
    /// object meanwhile (the crate doc, "Commit protocol").
    pub(crate) fn pin(&mut self, phys: u64) {
        assert!(self.refcount.contains_key(&phys), "pinning unreferenced block {phys}");
        *self.pins.entry(phys).or_insert(0) += 1;
    }

    /// Drops one pin; the last pin of a block freed meanwhile frees it.
    pub(crate) fn unpin(&mut self, phys: u64) {
        let c = self.pins.get_mut(&phys).expect("unpinning a block that is not pinned");
        *c -= 1;
        if *c == 0 {
            self.pins.remove(&phys);
            if self.pinned_free.remove(&phys) {
                self.to_punch.push(phys);
            }
        }
    }

    pub(crate) fn dirty_object(&mut self, p: u64, o: u64) -> &mut DirtyObject {
        self.dirty.objects.entry((p, o)).or_default()
    }

    /// Maps logical block `l` of object `o` to `new` (None: a hole). The
    /// block it replaces is dereferenced, unless the object's open
    /// transaction first changes `l` now: then the transaction's undo takes
    /// over its reference (or records the hole), so the block stays in use
    /// until the transaction ends. Every change of an object's block map goes
    /// through here or [`Store::roll_back`].
    fn set_block(&mut self, p: u64, o: u64, l: u64, new: Option<BlockRef>) {
        let obj = self.object_mut(p, o).expect("object of a block being mapped");
        let old = match new {
            Some(b) => obj.blocks.insert(l, b),
            None => obj.blocks.remove(&l),
        };
        let mut release = old;
        let mut undo_changed = false;
        let mut written_in_txn = false;
        if let Some(txn) = obj.txn.as_mut() {
            match txn.undo.entry(l) {
                std::collections::btree_map::Entry::Vacant(e) => {
                    if old.is_some() || new.is_some() {
                        e.insert(old);
                        release = None;
                        undo_changed = true;
                    }
                }
                std::collections::btree_map::Entry::Occupied(e) => {
                    written_in_txn = true;
                    if e.get().is_none() && new.is_none() {
                        // A hole before and a hole again: nothing to undo.
                        e.remove();
                        undo_changed = true;
                    }
                }
            }
        }
        if let Some(b) = release {
            // A block written under the transaction is the object's alone
            // (FASTCOPY of an object in a transaction is refused), so an
            // abort can free it.
            assert!(
                !written_in_txn || self.refcount.get(&b.phys) == Some(&1),
                "block {} written in a transaction is shared",
                b.phys
            );
            self.deref_block(p, b.phys);
        }
        let d = self.dirty_object(p, o);
        d.blocks.insert(l);
        if undo_changed {
            d.undo.insert(l);
        }
    }

    /// Whether replacing or dropping block `l` (stored at `r`) of `obj` frees
    /// `r`: it is referenced once, and no open transaction will hold it.
    fn frees(&self, obj: &Object, l: u64, r: &BlockRef) -> bool {
        self.refcount.get(&r.phys) == Some(&1) && obj.txn.as_ref().is_none_or(|t| t.undo.contains_key(&l))
    }

    /// Drops every reference `obj` holds: its index and its transaction's undo.
    fn release_object(&mut self, p: u64, obj: &Object) {
        let held = obj.txn.iter().flat_map(|t| t.undo.values().flatten());
        for r in obj.blocks.values().chain(held) {
            self.deref_block(p, r.phys);
        }
    }

    fn quota_check(&self, p: u64, extra_blocks: u64, block_size: u64) -> Result<(), StoreError> {
        let part = self.partition(p)?;
        let quota_blocks = part.quota_bytes / block_size;
        let charged = part.charged_blocks();
        if charged + extra_blocks > quota_blocks {
            return Err(StoreError::QuotaExceeded {
                partition: p,
                needed_blocks: extra_blocks,
                free_blocks: quota_blocks.saturating_sub(charged),
            });
        }
        Ok(())
    }

    /// Sum over `blocks` of 1/refcount: a shared block is split between the
    /// objects sharing it, so blocks_used summed over objects is honest.
    /// Blocks an open transaction holds to undo its changes count too.
    fn blocks_used(&self, obj: &Object) -> u64 {
        let held = obj.txn.iter().flat_map(|t| t.undo.values().flatten());
        let share: f64 =
            obj.blocks.values().chain(held).map(|r| 1.0 / *self.refcount.get(&r.phys).unwrap_or(&1) as f64).sum();
        share.round() as u64
    }
}

fn check_settable(mask: AttrMask, block_size: u32, attrs: &Attributes) -> Result<(), StoreError> {
    if !AttrMask::ALL.contains(mask) {
        return Err(StoreError::BadArgument("undefined attribute mask bits"));
    }
    if mask.intersects(AttrMask::DRIVE_MAINTAINED) {
        return Err(StoreError::AttributeNotSettable(
            "copied_object, blocks_used, create_time, data_modify_time and attribute_modify_time are set by the drive",
        ));
    }
    if mask.contains(AttrMask::BLOCK_SIZE) && attrs.block_size != block_size {
        return Err(StoreError::AttributeNotSettable("block_size: this drive supports only its own block size"));
    }
    if mask.contains(AttrMask::LOGICAL_SIZE) && attrs.logical_size > OBJECT_SIZE_MAX {
        return Err(StoreError::AttributeNotSettable("logical_size beyond OBJECT_SIZE_MAX"));
    }
    Ok(())
}

/// A read's position: (region index, logical block), in the order the read
/// serves them.
type ReadPos = (usize, u64);

/// The part of an object's block map a read holds, **pinned**: the mapped
/// blocks at the read's positions from `start` up to `end` (exclusive), at
/// most [`READ_BATCH_BLOCKS`], taken in one critical section of the
/// metadata lock, so each batch is one consistent view of the object (the
/// first one taken with the object's size). The pins keep the blocks from
/// being reused while the read serves them without any lock, however the
/// object changes meanwhile; they go with the batch (refill or drop).
struct ReadBatch<'a> {
    store: &'a Store,
    partition: u64,
    object: u64,
    /// The partition's incarnation when the read began.
    incarnation: u64,
    /// The positions covered, [start, end); None before the first batch.
    span: Option<(ReadPos, ReadPos)>,
    /// The mapped blocks among them, each pinned once, in read order.
    refs: Vec<(ReadPos, BlockRef)>,
}

impl<'a> ReadBatch<'a> {
    fn new(store: &'a Store, partition: u64, object: u64) -> Self {
        ReadBatch { store, partition, object, incarnation: 0, span: None, refs: Vec::new() }
    }

    /// Where the block at `at` is stored (None: a hole), taking the next
    /// batch from `at` on when `at` is outside the one held. `extents`:
    /// each region's first and last logical block (None: it reads nothing).
    fn get(&mut self, extents: &[Option<(u64, u64)>], at: ReadPos) -> Result<Option<BlockRef>, StoreError> {
        if !self.span.is_some_and(|(start, end)| start <= at && at < end) {
            self.fill(&mut lock(&self.store.meta), extents, at)?;
        }
        Ok(self.refs.binary_search_by_key(&at, |(pos, _)| *pos).ok().map(|i| self.refs[i].1))
    }

    /// Drops the batch held and takes (and pins) the next, from `from` on.
    /// The object gone — or its partition removed, even if another of the
    /// same number exists now — is [`StoreError::NoSuchObject`].
    fn fill(&mut self, m: &mut Meta, extents: &[Option<(u64, u64)>], from: ReadPos) -> Result<(), StoreError> {
        for (_, b) in self.refs.drain(..) {
            m.unpin(b.phys);
        }
        self.span = None;
        let (p, o) = (self.partition, self.object);
        let gone = StoreError::NoSuchObject { partition: p, object: o };
        let part = m.partition(p)?;
        if part.incarnation != self.incarnation {
            return Err(gone);
        }
        let obj = part.objects.get(&o).ok_or(gone)?;
        let mut end = (extents.len(), 0);
        'walk: for (i, extent) in extents.iter().enumerate().skip(from.0) {
            let Some((first, last)) = *extent else { continue };
            let first = if i == from.0 { first.max(from.1) } else { first };
            if first > last {
                continue;
            }
            for (&l, &b) in obj.blocks.range(first..=last) {
                if self.refs.len() == READ_BATCH_BLOCKS {
                    end = (i, l);
                    break 'walk;
                }
                self.refs.push(((i, l), b));
            }
        }
        for (_, b) in &self.refs {
            m.pin(b.phys);
        }
        self.span = Some((from, end));
        Ok(())
    }
}

impl Drop for ReadBatch<'_> {
    fn drop(&mut self) {
        if !self.refs.is_empty() {
            let mut m = lock(&self.store.meta);
            for (_, b) in self.refs.drain(..) {
                m.unpin(b.phys);
            }
        }
    }
}

/// Logical block `l` of object `o` in partition `p`, stored at `b`, fails
/// its digest: logged (no data), and the error a read reports.
fn corrupt(p: u64, o: u64, l: u64, b: &BlockRef) -> StoreError {
    tracing::error!(partition = p, object = o, block = l, phys = b.phys, "stored block fails its digest");
    StoreError::DataCorrupted { partition: p, object: o, block: l }
}

/// A block reference with where it belongs: (partition, object, logical
/// block, reference).
type BlockAt = (u64, u64, u64, BlockRef);

/// A write's bookkeeping while its data streams to new blocks.
struct WritePlan {
    partition: u64,
    object: u64,
    /// The partition's incarnation when the write was planned.
    incarnation: u64,
    reserved_inflight: u64,
    /// Logical block → its new block, as written so far (None: the block
    /// is all zeros, a hole: it takes no block).
    new: BTreeMap<u64, Option<BlockRef>>,
    /// The blocks the write covers only in part: what their other bytes
    /// were taken from, and which bytes are the write's. At most two per
    /// region (its first and last block).
    merged: BTreeMap<u64, Merge>,
}

/// A block a write covers only in part.
struct Merge {
    /// The mapping whose bytes filled the rest of the block (None: a hole):
    /// the object's when the block was first loaded. If the object maps
    /// another by the time the write installs, the block is merged again
    /// from that one ([`Store::remerge`]).
    base: Option<BlockRef>,
    /// The write's bytes in the block: (offset, length) pairs.
    ranges: Vec<(usize, usize)>,
}

impl Store {
    // ---------------------------------------------------------------- objects

    /// Creates an object, setting the attributes in `mask` from `attrs`.
    pub fn create(&self, p: u64, mask: AttrMask, attrs: &Attributes) -> Result<(u64, Attributes), StoreError> {
        self.check_healthy()?;
        check_settable(mask, self.block_size, attrs)?;
        let now = self.now_ns();
        let mut m = lock(&self.meta);
        let part = m.partition(p)?;
        if part.objects.len() as u64 >= OBJECTS_PER_PARTITION_MAX {
            return Err(StoreError::TooMany("objects in this partition"));
        }
        let reserved = if mask.contains(AttrMask::BLOCKS_ALLOCATED) { attrs.blocks_allocated } else { 0 };
        m.quota_check(p, reserved, self.bs())?;
        let id = self.next_object_id(&mut m, p)?;
        let mut a = self.fresh_attrs(now);
        a.apply(mask, attrs);
        let obj = Object { attrs: a, reserved, blocks: BTreeMap::new(), txn: None, pal: None, pal_stamp: 0 };
        let part = m.partition_mut(p)?;
        part.slack_blocks += obj.slack();
        part.objects.insert(id, obj);
        m.dirty_object(p, id).replaced = true;
        let attrs = self.attrs_of(&m, p, id)?;
        Ok((id, attrs))
    }

    fn fresh_attrs(&self, now: u64) -> Attributes {
        Attributes {
            block_size: self.block_size,
            create_time: now,
            data_modify_time: now,
            attribute_modify_time: now,
            fs_data_modify_time: now,
            fs_attribute_modify_time: now,
            ..Attributes::default()
        }
    }

    /// Hands out the next identifier, durably raising the high-water mark first
    /// when needed so that no identifier is ever handed out twice.
    fn next_object_id(&self, m: &mut Meta, p: u64) -> Result<u64, StoreError> {
        let part = m.partition_mut(p)?;
        let id = part.next_id;
        if id >= part.high_water {
            let high = id + ID_RESERVE_BATCH;
            db::raise_high_water(&lock(&self.db), p, high)?;
            part.high_water = high;
            m.dirty.partitions.insert(p);
        }
        let part = m.partition_mut(p)?;
        part.next_id = id + 1;
        Ok(id)
    }

    /// Removes an object and releases its blocks.
    pub fn remove(&self, p: u64, o: u64) -> Result<(), StoreError> {
        self.check_healthy()?;
        if o <= FIRST_OBJECT {
            return Err(StoreError::ReadOnlyObject(o));
        }
        let _g = self.stripe(p, o).write().expect("object lock poisoned");
        let mut m = lock(&self.meta);
        m.object(p, o)?;
        let obj = m.partition_mut(p)?.objects.remove(&o).expect("checked above");
        let part = m.partition_mut(p)?;
        part.slack_blocks -= obj.slack();
        part.txn_objects.remove(&o);
        m.release_object(p, &obj);
        m.dirty.objects.remove(&(p, o));
        m.dirty.removed_objects.insert((p, o));
        Ok(())
    }

    /// An object's attributes (control objects included).
    pub fn getattr(&self, p: u64, o: u64) -> Result<Attributes, StoreError> {
        if is_control(o) {
            let len = self.control_bytes(p, o)?.len() as u64;
            let now = self.now_ns();
            let mut a = self.fresh_attrs(now);
            a.logical_size = len;
            return Ok(a);
        }
        let m = lock(&self.meta);
        self.attrs_of(&m, p, o)
    }

    /// An object's `access_control_version` alone (no block accounting):
    /// what a drive checks on every capability request.
    pub fn access_control_version(&self, p: u64, o: u64) -> Result<u64, StoreError> {
        if is_control(o) {
            lock(&self.meta).partition(p)?;
            return Ok(0);
        }
        Ok(lock(&self.meta).object(p, o)?.attrs.access_control_version)
    }

    fn attrs_of(&self, m: &Meta, p: u64, o: u64) -> Result<Attributes, StoreError> {
        let obj = m.object(p, o)?;
        let mut a = obj.attrs.clone();
        a.blocks_used = m.blocks_used(obj);
        a.blocks_allocated = obj.reserved.max(obj.blocks.len() as u64);
        Ok(a)
    }

    /// Sets the attributes in `mask`; returns the new attributes.
    pub fn setattr(&self, p: u64, o: u64, mask: AttrMask, attrs: &Attributes) -> Result<Attributes, StoreError> {
        self.check_healthy()?;
        if is_control(o) {
            return Err(StoreError::ReadOnlyObject(o));
        }
        check_settable(mask, self.block_size, attrs)?;
        let _g = self.stripe(p, o).write().expect("object lock poisoned");
        lock(&self.meta).object(p, o)?;
        let mut undo_reserved = None;
        if mask.contains(AttrMask::BLOCKS_ALLOCATED) {
            let mut m = lock(&self.meta);
            let obj = m.object(p, o)?;
            undo_reserved = Some(obj.reserved);
            let old_slack = obj.slack();
            let new_slack = attrs.blocks_allocated.saturating_sub(obj.blocks.len() as u64);
            if new_slack > old_slack {
                m.quota_check(p, new_slack - old_slack, self.bs())?;
            }
            m.object_mut(p, o)?.reserved = attrs.blocks_allocated;
            let part = m.partition_mut(p)?;
            part.slack_blocks = part.slack_blocks - old_slack + new_slack;
        }
        if mask.contains(AttrMask::LOGICAL_SIZE) {
            if let Err(e) = self.set_size(p, o, attrs.logical_size) {
                // set_size failed without changing anything: the request as a
                // whole must not change anything either, so restore the reservation.
                if let Some(old) = undo_reserved {
                    let mut m = lock(&self.meta);
                    let obj = m.object_mut(p, o)?;
                    let cur_slack = obj.slack();
                    obj.reserved = old;
                    let old_slack = obj.slack();
                    let part = m.partition_mut(p)?;
                    part.slack_blocks = part.slack_blocks - cur_slack + old_slack;
                }
                return Err(e);
            }
        }
        let now = self.now_ns();
        let mut m = lock(&self.meta);
        let obj = m.object_mut(p, o)?;
        let keep = AttrMask(AttrMask::ALL.0 & !(AttrMask::LOGICAL_SIZE.0 | AttrMask::BLOCKS_ALLOCATED.0));
        obj.attrs.apply(AttrMask(mask.0 & keep.0), attrs);
        obj.attrs.attribute_modify_time = now;
        if !mask.contains(AttrMask::FS_ATTRIBUTE_MODIFY_TIME) {
            obj.attrs.fs_attribute_modify_time = now;
        }
        m.dirty_object(p, o);
        self.attrs_of(&m, p, o)
    }

    /// Truncates or extends an object (caller holds its write lock). Keeps the
    /// invariant that stored bytes past `logical_size` are zero.
    fn set_size(&self, p: u64, o: u64, size: u64) -> Result<(), StoreError> {
        let old = lock(&self.meta).object(p, o)?.attrs.logical_size;
        let bs = self.bs();
        // The zeroed tail block is written first, invisibly; installing it,
        // dropping the blocks past the end and setting the size then happen in
        // one critical section, so no commit can persist a half-done truncation.
        let mut tail = None;
        if size < old {
            let tail_end = old.min(size.div_ceil(bs) * bs);
            // A hole needs no zeroing: allocating a block for it would charge
            // the quota (and fail in a full partition) for nothing.
            let tail_mapped = lock(&self.meta).object(p, o)?.blocks.contains_key(&(size / bs));
            if tail_end > size && tail_mapped {
                let zeros = vec![0u8; (tail_end - size) as usize];
                let region = [Region { offset: size, length: tail_end - size }];
                let mut plan = self.plan_write(p, o, &region)?;
                if let Err(e) = self.stream_write(&mut plan, &region, &mut &zeros[..]) {
                    self.abort_write(plan);
                    return Err(e);
                }
                tail = Some((plan, region));
            }
        }
        let now = self.now_ns();
        let mut m = lock(&self.meta);
        if size < old {
            // Dropping blocks a copy still shares frees no space but hands the
            // object's reservation back as slack: refuse if that breaks the quota.
            let obj = m.object(p, o)?;
            let first_dropped = size.div_ceil(bs);
            let kept = obj.blocks.range(..first_dropped).count() as u64;
            let freed = obj.blocks.range(first_dropped..).filter(|(l, r)| m.frees(obj, **l, r)).count() as u64;
            let slack_gain = obj.reserved.saturating_sub(kept) - obj.slack();
            if slack_gain > freed {
                if let Err(e) = m.quota_check(p, slack_gain - freed, bs) {
                    drop(m);
                    if let Some((plan, _)) = tail {
                        self.abort_write(plan);
                    }
                    return Err(e);
                }
            }
        }
        if let Some((plan, region)) = tail {
            // The object's lock was held since the tail block was read.
            let obj = m.object(p, o)?;
            assert!(
                plan.merged.iter().all(|(l, merge)| obj.blocks.get(l) == merge.base.as_ref()),
                "a truncation's tail block changed under the object's lock"
            );
            self.install_locked(&mut m, plan, &region, now);
        }
        if size < old {
            let first_dropped = size.div_ceil(bs);
            let obj = m.object(p, o)?;
            let old_slack = obj.slack();
            let dropped: Vec<u64> = obj.blocks.range(first_dropped..).map(|(l, _)| *l).collect();
            for l in dropped {
                m.set_block(p, o, l, None);
            }
            let new_slack = m.object(p, o)?.slack();
            let part = m.partition_mut(p)?;
            part.slack_blocks = part.slack_blocks - old_slack + new_slack;
        }
        let obj = m.object_mut(p, o)?;
        obj.attrs.logical_size = size;
        obj.attrs.data_modify_time = now;
        obj.attrs.fs_data_modify_time = now;
        m.dirty_object(p, o);
        Ok(())
    }

    /// Reads `regions`: the sink gets the per-region lengths (short only at the
    /// end of the object), then the bytes in region order. Blocks are checked
    /// against their stored digests if the store verifies reads.
    ///
    /// No lock is held while the sink takes data: the read takes the blocks
    /// it serves [`READ_BATCH_BLOCKS`] at a time, pinned. A read of at most
    /// that many stored blocks sees each write wholly or not at all; a
    /// longer one, batch by batch. The object removed between two batches
    /// fails the read with [`StoreError::NoSuchObject`].
    pub fn read(&self, p: u64, o: u64, regions: &[Region], sink: &mut dyn DataSink) -> Result<(), StoreError> {
        self.read_with(p, o, regions, sink, self.verify_reads)
    }

    /// [`Store::read`], choosing whether to check blocks served whole against
    /// their stored digests (`verify`): a reader that is sent the stored digest
    /// of each whole block and checks it itself — Hash-and-MAC — makes the
    /// store's check redundant. A block served only in part is checked
    /// whenever the store verifies reads, whatever `verify` says: its stored
    /// digest does not travel, so no one else can check it.
    pub fn read_with(
        &self,
        p: u64,
        o: u64,
        regions: &[Region],
        sink: &mut dyn DataSink,
        verify: bool,
    ) -> Result<(), StoreError> {
        validate_regions(regions).map_err(StoreError::Regions)?;
        if is_control(o) {
            let bytes = self.control_bytes(p, o)?;
            return serve_bytes(&bytes, regions, sink);
        }
        // No object lock: the size and the first batch of the block map are
        // one view of the object (one critical section of the metadata
        // lock), and the blocks of each batch are pinned while the sink
        // takes their bytes, which may wait on the network.
        let bs = self.bs();
        let mut batch = ReadBatch::new(self, p, o);
        let (lengths, extents) = {
            let mut m = lock(&self.meta);
            let size = m.object(p, o)?.attrs.logical_size;
            batch.incarnation = m.partition(p)?.incarnation;
            let lengths: Vec<u64> = regions.iter().map(|r| r.end().min(size).saturating_sub(r.offset)).collect();
            let extents: Vec<Option<(u64, u64)>> = regions
                .iter()
                .zip(&lengths)
                .map(|(r, &n)| (n > 0).then(|| (r.offset / bs, (r.offset + n - 1) / bs)))
                .collect();
            if let Some(i) = extents.iter().position(Option::is_some) {
                let first = extents[i].expect("found").0;
                batch.fill(&mut m, &extents, (i, first))?;
            }
            (lengths, extents)
        };
        sink.start(&lengths).map_err(StoreError::Sink)?;
        let mut buf = vec![0u8; bs as usize];
        // The block in `buf`, and whether it was checked against its digest.
        let mut loaded: Option<(BlockRef, bool)> = None;
        for (i, (r, &len)) in regions.iter().zip(&lengths).enumerate() {
            let mut pos = r.offset;
            let end = r.offset + len;
            while pos < end {
                let l = pos / bs;
                let in_off = (pos % bs) as usize;
                let n = ((bs - pos % bs).min(end - pos)) as usize;
                let whole = in_off == 0 && n == bs as usize;
                match batch.get(&extents, (i, l))? {
                    Some(b) => {
                        let check = verify || (!whole && self.verify_reads);
                        match loaded {
                            Some((at, checked)) if at == b => {
                                if check && !checked {
                                    self.check_block(p, o, l, &b, &buf)?;
                                    loaded = Some((b, true));
                                }
                            }
                            _ => {
                                self.read_block_with(p, o, l, &b, &mut buf, check)?;
                                loaded = Some((b, check));
                            }
                        }
                        sink.unit(&buf[in_off..in_off + n], whole.then_some(&b.digest))
                            .map_err(|e| self.sink_error(e, p, o, l, &b))?;
                    }
                    None => sink.unit(&ZEROS[..n], whole.then_some(&self.zero_digest)).map_err(StoreError::Sink)?,
                }
                pos += n as u64;
            }
        }
        Ok(())
    }

    /// A sink's error, as the store reports it: a sink that found a whole
    /// block's bytes do not match the stored digest it was given
    /// ([`nasd_crypto::StoredDigestMismatch`]) reports the block corrupt.
    fn sink_error(&self, e: std::io::Error, p: u64, o: u64, l: u64, b: &BlockRef) -> StoreError {
        if e.get_ref().is_some_and(|inner| inner.is::<nasd_crypto::StoredDigestMismatch>()) {
            return corrupt(p, o, l, b);
        }
        StoreError::Sink(e)
    }

    /// Reads one stored block and checks it against its stored digest.
    fn read_block(&self, p: u64, o: u64, l: u64, b: &BlockRef, buf: &mut [u8]) -> Result<(), StoreError> {
        self.read_block_with(p, o, l, b, buf, self.verify_reads)
    }

    fn read_block_with(
        &self,
        p: u64,
        o: u64,
        l: u64,
        b: &BlockRef,
        buf: &mut [u8],
        verify: bool,
    ) -> Result<(), StoreError> {
        // A cached block was checked against its digest when it was cached.
        if self.cache.read(b, buf) {
            return Ok(());
        }
        self.read_media(buf, b.phys * self.bs())?;
        if verify {
            self.check_block(p, o, l, b, buf)?;
        }
        Ok(())
    }

    /// Checks a block read into `buf` against its stored digest.
    fn check_block(&self, p: u64, o: u64, l: u64, b: &BlockRef, buf: &[u8]) -> Result<(), StoreError> {
        if !ct_eq(&block_digest(buf), &b.digest) {
            return Err(corrupt(p, o, l, b));
        }
        Ok(())
    }

    /// Writes `regions` with the data from `source` (the regions' bytes in
    /// order). Atomic: on any error nothing changes. Returns bytes written.
    pub fn write(&self, p: u64, o: u64, regions: &[Region], source: &mut dyn DataSource) -> Result<u64, StoreError> {
        self.write_checked(p, o, regions, source, WriteCheck::default())
    }

    /// Like [`Store::write`], but only if every region starts at or past the
    /// object's end, checked under the object's lock as the write installs,
    /// so no concurrent write can turn the append into an overwrite.
    pub fn append(&self, p: u64, o: u64, regions: &[Region], source: &mut dyn DataSource) -> Result<u64, StoreError> {
        self.write_checked(p, o, regions, source, WriteCheck { append_only: true, ..WriteCheck::default() })
    }

    /// [`Store::write`], installing only if the object still passes `check`
    /// (checked when the write is planned and again, under the object's
    /// lock, as it installs).
    ///
    /// The object's lock is held only to plan the write (its quota charge)
    /// and to install it, never while `source` is waited on: the data goes
    /// to new blocks meanwhile, and other writes of the object may install
    /// in between. A block the write covers only in part whose mapping
    /// changed since the write read it is merged again from the current
    /// block at install, so no byte another write installed meanwhile is
    /// lost; where two writes overlap, the one that installs last wins.
    pub fn write_checked(
        &self,
        p: u64,
        o: u64,
        regions: &[Region],
        source: &mut dyn DataSource,
        check: WriteCheck,
    ) -> Result<u64, StoreError> {
        self.check_healthy()?;
        validate_regions(regions).map_err(StoreError::Regions)?;
        if is_control(o) {
            return Err(StoreError::ReadOnlyObject(o));
        }
        let mut plan = {
            let _g = self.stripe(p, o).write().expect("object lock poisoned");
            Self::check_write(&lock(&self.meta), p, o, regions, check)?;
            self.plan_write(p, o, regions)?
        };
        if let Err(e) = self.stream_write(&mut plan, regions, source) {
            self.abort_write(plan);
            return Err(e);
        }
        let _g = self.stripe(p, o).write().expect("object lock poisoned");
        match self.prepare_install(&mut plan, regions, check) {
            Ok(mut m) => {
                let now = self.now_ns();
                self.install_locked(&mut m, plan, regions, now);
                Ok(regions.iter().map(|r| r.length).sum())
            }
            Err(e) => {
                self.abort_write(plan);
                Err(e)
            }
        }
    }

    /// What a write must find in the object ([`WriteCheck`]).
    fn check_write(m: &Meta, p: u64, o: u64, regions: &[Region], check: WriteCheck) -> Result<(), StoreError> {
        let attrs = &m.object(p, o)?.attrs;
        if check.access_control_version.is_some_and(|acv| acv != attrs.access_control_version) {
            return Err(StoreError::AccessRevoked { partition: p, object: o });
        }
        if let Some(stamp) = check.pal {
            if stamp != m.pal_stamp(p, o)? {
                return Err(StoreError::PalChanged { partition: p, object: o });
            }
        }
        let logical_size = attrs.logical_size;
        if check.append_only && regions.iter().any(|r| r.offset < logical_size) {
            return Err(StoreError::NotAnAppend { logical_size });
        }
        Ok(())
    }

    /// Everything an install must check, with the object's lock held: the
    /// object is the one planned for and still passes `check`; blocks
    /// covered in part are merged again where their mapping changed (disk
    /// I/O, without the metadata lock); the charge is within the quota
    /// (what the write replaces may have changed since it was planned: a
    /// transaction begun meanwhile holds the old blocks, a clone shares
    /// them). Returns the metadata lock to install under.
    fn prepare_install(
        &self,
        plan: &mut WritePlan,
        regions: &[Region],
        check: WriteCheck,
    ) -> Result<MutexGuard<'_, Meta>, StoreError> {
        let (p, o) = (plan.partition, plan.object);
        let changed: Vec<(u64, Option<BlockRef>)> = {
            let m = lock(&self.meta);
            if m.partition(p)?.incarnation != plan.incarnation {
                return Err(StoreError::NoSuchObject { partition: p, object: o });
            }
            Self::check_write(&m, p, o, regions, check)?;
            let obj = m.object(p, o)?;
            plan.merged
                .iter()
                .map(|(l, merge)| (*l, merge.base, obj.blocks.get(l).copied()))
                .filter(|(_, base, now)| base != now)
                .map(|(l, _, now)| (l, now))
                .collect()
        };
        for (l, now) in changed {
            self.remerge(plan, l, now)?;
        }
        let m = lock(&self.meta);
        let obj = m.object(p, o)?;
        let (_, charge) = Self::added_blocks(&m, obj, &self.touched_ranges(regions));
        if charge > plan.reserved_inflight {
            m.quota_check(p, charge - plan.reserved_inflight, self.bs())?;
        }
        Ok(m)
    }

    /// Merges block `l` of a write again, from `now` (the object's current
    /// mapping of it, None: a hole) and the write's own bytes in it, into
    /// the write's new block (written by this write alone, so rewritten in
    /// place). The caller holds the object's lock, so `now` stays mapped.
    fn remerge(&self, plan: &mut WritePlan, l: u64, now: Option<BlockRef>) -> Result<(), StoreError> {
        let bs = self.bs() as usize;
        let mut ours = vec![0u8; bs];
        if let Some(mine) = plan.new[&l] {
            self.read_block_with(plan.partition, plan.object, l, &mine, &mut ours, true)?;
        }
        let mut buf = vec![0u8; bs];
        match &now {
            Some(b) => self.read_block(plan.partition, plan.object, l, b, &mut buf)?,
            None => buf.fill(0),
        }
        let merge = plan.merged.get_mut(&l).expect("a block covered in part");
        for &(at, n) in &merge.ranges {
            buf[at..at + n].copy_from_slice(&ours[at..at + n]);
        }
        merge.base = now;
        self.store_block(plan, l, &buf)
    }

    /// Logical blocks touched by `regions`, as sorted, disjoint, inclusive
    /// ranges. Costs O(regions), whatever the sizes.
    fn touched_ranges(&self, regions: &[Region]) -> Vec<(u64, u64)> {
        let bs = self.bs();
        let mut ranges: Vec<(u64, u64)> = regions.iter().map(|r| (r.offset / bs, (r.end() - 1) / bs)).collect();
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (first, last) in ranges {
            match merged.last_mut() {
                Some(prev) if first <= prev.1 + 1 => prev.1 = prev.1.max(last),
                _ => merged.push((first, last)),
            }
        }
        merged
    }

    /// Blocks a write of `ranges` needs: (new blocks, charge against the
    /// quota). Holes and shared blocks need new blocks; a block owned by this
    /// object alone is replaced one for one — unless an open transaction
    /// will hold it to undo the write. Costs O(mapped blocks in range).
    fn added_blocks(m: &Meta, obj: &Object, ranges: &[(u64, u64)]) -> (u64, u64) {
        let total: u64 = ranges.iter().map(|(f, l)| l - f + 1).sum();
        let (mut mapped, mut exclusive) = (0u64, 0u64);
        for &(first, last) in ranges {
            for (l, r) in obj.blocks.range(first..=last) {
                mapped += 1;
                if m.frees(obj, *l, r) {
                    exclusive += 1;
                }
            }
        }
        let added = total - exclusive;
        let slack_used = (total - mapped).min(obj.slack());
        (added, added - slack_used)
    }

    fn plan_write(&self, p: u64, o: u64, regions: &[Region]) -> Result<WritePlan, StoreError> {
        let ranges = self.touched_ranges(regions);
        let mut m = lock(&self.meta);
        let obj = m.object(p, o)?;
        let (added, charge) = Self::added_blocks(&m, obj, &ranges);
        m.quota_check(p, charge, self.bs())?;
        if added > m.free_blocks() {
            return Err(StoreError::NoSpace(format!(
                "write needs {added} new blocks, drive has {} free",
                m.free_blocks()
            )));
        }
        let part = m.partition_mut(p)?;
        part.inflight_blocks += charge;
        let incarnation = part.incarnation;
        Ok(WritePlan {
            partition: p,
            object: o,
            incarnation,
            reserved_inflight: charge,
            new: BTreeMap::new(),
            merged: BTreeMap::new(),
        })
    }

    /// Streams the write's data into new blocks, block by block, without
    /// the object's lock (the caller may hold it: `set_size` does).
    fn stream_write(
        &self,
        plan: &mut WritePlan,
        regions: &[Region],
        source: &mut dyn DataSource,
    ) -> Result<(), StoreError> {
        let bs = self.bs();
        let mut buf = vec![0u8; bs as usize];
        let mut current: Option<u64> = None;
        for r in regions {
            let mut pos = r.offset;
            while pos < r.end() {
                let l = pos / bs;
                let in_off = (pos % bs) as usize;
                let n = ((bs - pos % bs).min(r.end() - pos)) as usize;
                if current != Some(l) {
                    if let Some(cur) = current.take() {
                        self.store_block(plan, cur, &buf)?;
                    }
                    let whole = in_off == 0 && n == bs as usize;
                    self.load_for_merge(plan, l, whole, &mut buf)?;
                    current = Some(l);
                }
                if let Some(merge) = plan.merged.get_mut(&l) {
                    merge.ranges.push((in_off, n));
                }
                source.fill(&mut buf[in_off..in_off + n]).map_err(StoreError::Source)?;
                pos += n as u64;
            }
        }
        if let Some(cur) = current {
            self.store_block(plan, cur, &buf)?;
        }
        Ok(())
    }

    /// Fills `buf` with block `l`'s current contents before a partial
    /// overwrite: the write's own block if it wrote `l` already (another
    /// region in the same block), else the object's — pinned while it is
    /// read, as the object's lock need not be held — remembered as the
    /// block's base in `plan.merged`.
    fn load_for_merge(&self, plan: &mut WritePlan, l: u64, whole: bool, buf: &mut [u8]) -> Result<(), StoreError> {
        if whole {
            return Ok(());
        }
        let (p, o) = (plan.partition, plan.object);
        if let Some(mine) = plan.new.get(&l) {
            match mine {
                Some(b) => self.data.read_exact_at(buf, b.phys * self.bs())?,
                None => buf.fill(0),
            }
            return Ok(());
        }
        let base = {
            let mut m = lock(&self.meta);
            let base = m.object(p, o)?.blocks.get(&l).copied();
            if let Some(b) = &base {
                m.pin(b.phys);
            }
            base
        };
        match &base {
            Some(b) => {
                let read = self.read_block(p, o, l, b, buf);
                lock(&self.meta).unpin(b.phys);
                read?;
            }
            None => buf.fill(0),
        }
        plan.merged.insert(l, Merge { base, ranges: Vec::new() });
        Ok(())
    }

    /// Writes an assembled block to a new physical block (or back to the one
    /// this write already allocated for it). A block of zeros is a hole: it
    /// takes no block (one this write allocated for it is freed), costs no
    /// space and reads as zeros, with the digest of a hole.
    fn store_block(&self, plan: &mut WritePlan, l: u64, buf: &[u8]) -> Result<(), StoreError> {
        let digest = block_digest(buf);
        let mine = plan.new.get(&l).copied().flatten();
        if ct_eq(&digest, &self.zero_digest) {
            if let Some(b) = mine {
                lock(&self.meta).release_block(b.phys);
            }
            plan.new.insert(l, None);
            return Ok(());
        }
        let phys = match mine {
            Some(b) => b.phys,
            None => self.alloc_block(plan, l)?,
        };
        plan.new.insert(l, Some(BlockRef { phys, digest }));
        if let Err(e) = self.data.write_all_at(buf, phys * self.bs()) {
            return Err(self.fail(e));
        }
        Ok(())
    }

    /// A new block for logical block `l` of a write. Blocks freed but not
    /// yet punched are not in the allocator: when it has none, they are
    /// punched now (waiting for a punch in progress) and the allocation
    /// tried again.
    fn alloc_block(&self, plan: &WritePlan, l: u64) -> Result<u64, StoreError> {
        for punched in [false, true] {
            {
                let mut m = lock(&self.meta);
                let hint = self.placement_hint(&m, plan, l);
                if let Some(phys) = m.alloc.alloc(hint) {
                    m.fresh.insert(phys);
                    return Ok(phys);
                }
                if punched || (m.to_punch.is_empty() && m.punching == 0) {
                    break;
                }
            }
            self.punch_freed();
        }
        Err(StoreError::NoSpace("drive is full".into()))
    }

    /// Where to put a new block: after the previous logical block, else after
    /// the `nearby_object`'s last block.
    fn placement_hint(&self, m: &Meta, plan: &WritePlan, l: u64) -> Option<u64> {
        if l > 0 {
            if let Some(Some(b)) = plan.new.get(&(l - 1)) {
                return Some(b.phys + 1);
            }
        }
        let obj = m.object(plan.partition, plan.object).ok()?;
        if let Some((_, b)) = obj.blocks.range(..l).next_back() {
            return Some(b.phys + 1);
        }
        let nearby = obj.attrs.nearby_object;
        if nearby != 0 {
            let near = m.object(plan.partition, nearby).ok()?;
            return near.blocks.values().next_back().map(|b| b.phys + 1);
        }
        None
    }

    /// Installs a streamed write in the index at once (the caller holds the
    /// object's lock and the metadata lock, and checked the install:
    /// [`Store::prepare_install`]). Where an open transaction first changes
    /// a block, `set_block` records its undo here.
    fn install_locked(&self, m: &mut Meta, plan: WritePlan, regions: &[Region], now: u64) {
        let (p, o) = (plan.partition, plan.object);
        m.partitions.get_mut(&p).expect("partition of a locked object").inflight_blocks -= plan.reserved_inflight;
        let old_slack = m.object(p, o).expect("locked object exists").slack();
        for (l, new) in &plan.new {
            if let Some(new) = new {
                let prev = m.refcount.insert(new.phys, 1);
                assert!(prev.is_none(), "new block {} already referenced", new.phys);
                m.partitions.get_mut(&p).expect("partition").physical_blocks += 1;
            }
            m.set_block(p, o, *l, *new);
        }
        let end = regions.iter().map(Region::end).max().unwrap_or(0);
        let obj = m.object_mut(p, o).expect("object");
        let new_slack = obj.slack();
        obj.attrs.logical_size = obj.attrs.logical_size.max(end);
        obj.attrs.data_modify_time = now;
        obj.attrs.fs_data_modify_time = now;
        let part = m.partitions.get_mut(&p).expect("partition");
        part.slack_blocks = part.slack_blocks - old_slack + new_slack;
        assert!(part.physical_blocks + part.slack_blocks <= part.quota_bytes / self.bs(), "a write broke the quota");
    }

    /// Forgets a write that will not install: its charge goes back to its
    /// partition (unless that was removed meanwhile) and its new blocks to
    /// free space.
    fn abort_write(&self, plan: WritePlan) {
        let mut m = lock(&self.meta);
        if let Some(part) = m.partitions.get_mut(&plan.partition).filter(|part| part.incarnation == plan.incarnation) {
            part.inflight_blocks -= plan.reserved_inflight;
        }
        for b in plan.new.values().flatten() {
            m.release_block(b.phys);
        }
    }

    /// `fdatasync(blocks.dat)`: every block written so far is durable.
    fn sync_blocks(&self) -> std::io::Result<()> {
        #[cfg(feature = "sim-bugs")]
        if self.env.injected_bug(nasd_env::Bug::SkipBlockSync) {
            return Ok(());
        }
        self.data.sync_data()
    }

    /// Marks the store failed after a storage error (no retries on a device
    /// that lost writes) and converts the error.
    fn fail(&self, e: std::io::Error) -> StoreError {
        tracing::error!(error = %e, "storage write failed; refusing further changes");
        self.failed.store(true, Ordering::Release);
        StoreError::Io(e)
    }

    /// Clones `source` copy-on-write; the clone's `copied_object` names it.
    pub fn fastcopy(&self, p: u64, source: u64) -> Result<(u64, Attributes), StoreError> {
        self.check_healthy()?;
        if is_control(source) {
            return Err(StoreError::ReadOnlyObject(source));
        }
        let _g = self.stripe(p, source).read().expect("object lock poisoned");
        let now = self.now_ns();
        let mut m = lock(&self.meta);
        let src = m.object(p, source)?;
        if let Some(t) = &src.txn {
            // A copy would share blocks written under the transaction, which
            // an abort must be able to free.
            return Err(StoreError::TxnConflict { partition: p, object: source, open: t.id });
        }
        if m.partition(p)?.objects.len() as u64 >= OBJECTS_PER_PARTITION_MAX {
            return Err(StoreError::TooMany("objects in this partition"));
        }
        let blocks = src.blocks.clone();
        let reserved = src.reserved;
        let pal = src.pal.clone();
        let mut attrs = self.fresh_attrs(now);
        let settable = AttrMask(AttrMask::ALL.0 & !AttrMask::DRIVE_MAINTAINED.0);
        attrs.apply(settable, &src.attrs);
        attrs.copied_object = source;
        let slack = src.slack();
        m.quota_check(p, slack, self.bs())?;
        let id = self.next_object_id(&mut m, p)?;
        for b in blocks.values() {
            *m.refcount.get_mut(&b.phys).expect("source block referenced") += 1;
        }
        let part = m.partition_mut(p)?;
        part.slack_blocks += slack;
        // The clone is as protected as its source: it shares the source's PAL.
        let pal_stamp = if pal.is_some() { m.next_pal_stamp() } else { 0 };
        let has_pal = pal.is_some();
        let part = m.partition_mut(p)?;
        part.objects.insert(id, Object { attrs, reserved, blocks: blocks.clone(), txn: None, pal, pal_stamp });
        let d = m.dirty_object(p, id);
        d.replaced = true;
        d.pal = has_pal;
        d.blocks.extend(blocks.keys());
        let attrs = self.attrs_of(&m, p, id)?;
        Ok((id, attrs))
    }

    /// Makes the listed objects durable (by committing everything).
    pub fn flush(&self, p: u64, objects: &[u64]) -> Result<(), StoreError> {
        {
            let m = lock(&self.meta);
            m.partition(p)?;
            for &o in objects {
                if !is_control(o) {
                    m.object(p, o)?;
                }
            }
        }
        self.commit()
    }

    /// Blocks that overwriting `regions` would add: (estimated, maximum). This
    /// drive does not compress, so the two are equal.
    pub fn blocks_required(&self, p: u64, o: u64, regions: &[Region]) -> Result<(u64, u64), StoreError> {
        validate_regions(regions).map_err(StoreError::Regions)?;
        if is_control(o) {
            return Err(StoreError::ReadOnlyObject(o));
        }
        let ranges = self.touched_ranges(regions);
        let m = lock(&self.meta);
        let (added, _) = Self::added_blocks(&m, m.object(p, o)?, &ranges);
        Ok((added, added))
    }

    /// The object's stored byte ranges (its allocated extents, where a read
    /// touches the disk) from `offset` on, in order and coalesced, each cut
    /// to `[offset, logical_size)`: at most `max` of them. Every other byte
    /// below `logical_size` is a hole (reads as zeros, costs nothing).
    ///
    /// Also returns `covered_end` (≥ `offset`): every stored byte in
    /// `[offset, covered_end)` is listed; at or past `logical_size` the list
    /// is complete, else the caller asks again from `covered_end`. One call
    /// walks at most [`EXTENTS_SCAN_BLOCKS_MAX`] block references (one hold
    /// of the metadata lock), whatever the object.
    ///
    /// # Errors
    /// [`StoreError::BadArgument`] if `max` is 0; no such partition or object.
    pub fn extents(&self, p: u64, o: u64, offset: u64, max: usize) -> Result<(Vec<Region>, u64), StoreError> {
        if max == 0 {
            return Err(StoreError::BadArgument("extents: at least one extent must be asked for"));
        }
        if is_control(o) {
            let len = self.control_bytes(p, o)?.len() as u64;
            let data = (offset < len).then_some(Region { offset, length: len - offset });
            return Ok((data.into_iter().collect(), len.max(offset)));
        }
        let bs = self.bs();
        let m = lock(&self.meta);
        let obj = m.object(p, o)?;
        let size = obj.attrs.logical_size;
        if offset >= size {
            return Ok((Vec::new(), offset));
        }
        let mut out: Vec<Region> = Vec::new();
        let mut covered = size;
        for (scanned, &l) in obj.blocks.range(offset / bs..size.div_ceil(bs)).map(|(l, _)| l).enumerate() {
            let (start, end) = ((l * bs).max(offset), ((l + 1) * bs).min(size));
            if scanned == EXTENTS_SCAN_BLOCKS_MAX {
                covered = start;
                break;
            }
            if let Some(r) = out.last_mut().filter(|r| r.end() == start) {
                r.length += end - start;
                continue;
            }
            if out.len() == max {
                covered = start;
                break;
            }
            out.push(Region { offset: start, length: end - start });
        }
        Ok((out, covered))
    }

    /// The object's `logical_size` and the stored digest of each block of
    /// `region` that starts below it, in order (a hole's is the digest of a
    /// block of zeros), from the index alone: no block is read or hashed.
    /// One hold of the metadata lock, so one view of the object.
    ///
    /// # Errors
    /// [`StoreError::Regions`] for a region the region rules refuse, or one
    /// of more than [`DIGESTS_MAX`] blocks (`LIMIT_EXCEEDED`);
    /// [`StoreError::BadArgument`] if it is not block-aligned or names a
    /// control object (they keep no digests); no such partition or object.
    pub fn block_digests(&self, p: u64, o: u64, region: Region) -> Result<(u64, Vec<BlockDigest>), StoreError> {
        validate_regions(&[region]).map_err(StoreError::Regions)?;
        let bs = self.bs();
        if !region.offset.is_multiple_of(bs) || !region.length.is_multiple_of(bs) {
            return Err(StoreError::BadArgument("digests: the region must be whole blocks"));
        }
        if region.length / bs > DIGESTS_MAX as u64 {
            return Err(StoreError::Regions(nasd_proto::Status::LimitExceeded));
        }
        if is_control(o) {
            return Err(StoreError::BadArgument("digests: control objects keep no stored digests"));
        }
        let m = lock(&self.meta);
        let obj = m.object(p, o)?;
        let size = obj.attrs.logical_size;
        let (first, end) = (region.offset / bs, region.end().min(size.next_multiple_of(bs)) / bs);
        let digests =
            (first..end.max(first)).map(|l| obj.blocks.get(&l).map_or(self.zero_digest, |b| b.digest)).collect();
        Ok((size, digests))
    }

    // ------------------------------------------------------------- partitions

    /// Creates an empty partition (quota 0) with its first object.
    pub fn create_partition(&self, p: u64) -> Result<(), StoreError> {
        self.check_healthy()?;
        if p == 0 {
            return Err(StoreError::BadArgument("partition 0 is reserved"));
        }
        let now = self.now_ns();
        let mut m = lock(&self.meta);
        if m.partitions.contains_key(&p) {
            return Err(StoreError::PartitionExists(p));
        }
        if m.partitions.len() >= PARTITIONS_MAX {
            return Err(StoreError::TooMany("partitions"));
        }
        let mut objects = BTreeMap::new();
        let first = Object {
            attrs: self.fresh_attrs(now),
            reserved: 0,
            blocks: BTreeMap::new(),
            txn: None,
            pal: None,
            pal_stamp: 0,
        };
        objects.insert(FIRST_OBJECT, first);
        m.incarnations += 1;
        let incarnation = m.incarnations;
        m.partitions.insert(
            p,
            Partition {
                quota_bytes: 0,
                objects,
                next_id: FIRST_USER_OBJECT,
                high_water: FIRST_USER_OBJECT,
                physical_blocks: 0,
                slack_blocks: 0,
                inflight_blocks: 0,
                txn_objects: BTreeSet::new(),
                incarnation,
                collections: BTreeMap::new(),
            },
        );
        m.dirty.partitions.insert(p);
        m.dirty_object(p, FIRST_OBJECT).replaced = true;
        Ok(())
    }

    /// Removes a partition; unless `force`, only if it holds no data.
    pub fn remove_partition(&self, p: u64, force: bool) -> Result<(), StoreError> {
        self.check_healthy()?;
        let _all = self.lock_all();
        let mut m = lock(&self.meta);
        let part = m.partition(p)?;
        let holds_data = part.objects.iter().any(|(&id, o)| id >= FIRST_USER_OBJECT || o.attrs.logical_size > 0);
        if holds_data && !force {
            return Err(StoreError::PartitionNotEmpty(p));
        }
        self.drop_partition(&mut m, p);
        Ok(())
    }

    /// Releases a partition's blocks and forgets it (caller holds every object lock).
    fn drop_partition(&self, m: &mut Meta, p: u64) {
        self.release_partition_blocks(m, p);
        m.partitions.remove(&p);
        m.dirty.partitions.remove(&p);
        m.dirty.objects.retain(|(pp, _), _| *pp != p);
        m.dirty.removed_objects.retain(|(pp, _)| *pp != p);
        m.dirty.collections.retain(|(pp, _)| *pp != p);
        m.dirty.removed_partitions.insert(p);
    }

    /// Sets a partition's quota in bytes.
    pub fn resize_partition(&self, p: u64, quota_bytes: u64) -> Result<(), StoreError> {
        self.check_healthy()?;
        let mut m = lock(&self.meta);
        let part = m.partition(p)?;
        let used = part.charged_blocks() * self.bs();
        if quota_bytes < used {
            return Err(StoreError::QuotaBelowUsage { partition: p, used_bytes: used });
        }
        let others: u64 = m.partitions.iter().filter(|(&id, _)| id != p).map(|(_, q)| q.quota_bytes).sum();
        if others.saturating_add(quota_bytes) > self.capacity_bytes {
            return Err(StoreError::NoSpace(format!(
                "quotas would total {} bytes; the drive holds {}",
                others.saturating_add(quota_bytes),
                self.capacity_bytes
            )));
        }
        m.partition_mut(p)?.quota_bytes = quota_bytes;
        m.dirty.partitions.insert(p);
        Ok(())
    }

    /// Makes a partition durable (by committing everything).
    pub fn flush_partition(&self, p: u64) -> Result<(), StoreError> {
        lock(&self.meta).partition(p)?;
        self.commit()
    }

    // ------------------------------------------------------------------ drive

    /// Removes every partition and sets the drive clock (`clock_ns` 0 keeps it)
    /// and the allowed skew (0 keeps it); durable when it returns.
    pub fn initialize(&self, clock_ns: u64, clock_skew_ns: u64) -> Result<(), StoreError> {
        self.check_healthy()?;
        {
            let _all = self.lock_all();
            let mut m = lock(&self.meta);
            let ids: Vec<u64> = m.partitions.keys().copied().collect();
            for p in ids {
                self.drop_partition(&mut m, p);
            }
            if clock_ns != 0 {
                self.clock_offset_ns.store((clock_ns as i128 - self.env.now_ns() as i128) as i64, Ordering::Relaxed);
            }
            if clock_skew_ns != 0 {
                self.clock_skew_ns.store(clock_skew_ns, Ordering::Relaxed);
            }
            m.dirty.drive = true;
        }
        self.commit()
    }

    fn release_partition_blocks(&self, m: &mut Meta, p: u64) {
        let part = m.partitions.get_mut(&p).expect("partition");
        let objects = std::mem::take(&mut part.objects);
        part.txn_objects.clear();
        for obj in objects.values() {
            m.release_object(p, obj);
        }
        m.partitions.get_mut(&p).expect("partition").slack_blocks = 0;
    }

    /// The object's block map: (logical block, where it is stored and its
    /// digest), in logical order. For layout tools, scrubbing and tests.
    pub fn block_map(&self, p: u64, o: u64) -> Result<Vec<(u64, BlockRef)>, StoreError> {
        let m = lock(&self.meta);
        Ok(m.object(p, o)?.blocks.iter().map(|(l, b)| (*l, *b)).collect())
    }

    /// Drive-level settings whose names start with `prefix` (opaque to the
    /// store; the drive keeps its key hierarchy and minimums here).
    pub fn settings(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let conn = lock(&self.db);
        let mut st = conn.prepare("SELECT key, value FROM drive WHERE key >= ?1 AND key < ?2 ORDER BY key")?;
        let upper = format!("{prefix}\u{10FFFF}");
        let rows = st.query_map([format!("setting.{prefix}"), format!("setting.{upper}")], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (k, v) = row?;
            out.push((k["setting.".len()..].to_string(), v));
        }
        Ok(out)
    }

    /// Sets (Some) or deletes (None) drive-level settings in one durable
    /// transaction; returns when they are on disk.
    pub fn put_settings(&self, changes: &[(String, Option<Vec<u8>>)]) -> Result<(), StoreError> {
        self.check_healthy()?;
        let mut conn = lock(&self.db);
        let tx = conn.transaction()?;
        for (k, v) in changes {
            let key = format!("setting.{k}");
            match v {
                Some(v) => db::put_drive_value(&tx, &key, v)?,
                None => {
                    tx.execute("DELETE FROM drive WHERE key = ?1", [&key])?;
                }
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Re-reads every stored block and checks it against its stored digest
    /// (each physical block once, however many clones share it). A block
    /// that fails is reported only if the object still maps it after the
    /// check, so concurrent writes cause no false alarms. Holds no lock
    /// while reading.
    ///
    /// Memory: one bit per block of capacity (which blocks were checked)
    /// and one batch of [`SCRUB_BATCH_BLOCKS`] references: the index is
    /// walked batch by batch, never copied whole. A block written while the
    /// scrub runs may go unchecked (it was digested as it was written).
    pub fn scrub(&self) -> Result<ScrubReport, StoreError> {
        let capacity_blocks = self.capacity_bytes / self.bs();
        let mut checked = vec![0u64; capacity_blocks.div_ceil(64) as usize];
        let mut report = ScrubReport::default();
        let mut buf = vec![0u8; self.block_size as usize];
        let mut from = Some((0, 0, 0));
        while let Some(start) = from {
            let (mut refs, next) = self.scrub_batch(start);
            from = next;
            refs.retain(|r| {
                let (word, bit) = ((r.3.phys / 64) as usize, r.3.phys % 64);
                let seen = checked[word] & (1 << bit) != 0;
                checked[word] |= 1 << bit;
                !seen
            });
            refs.sort_unstable_by_key(|r| r.3.phys);
            for (p, o, l, b) in refs {
                self.scrub_block(p, o, l, &b, &mut buf, &mut report)?;
            }
        }
        Ok(report)
    }

    /// Up to [`SCRUB_BATCH_BLOCKS`] (partition, object, logical block, ref)
    /// in index order from `start` (inclusive), and where the next batch
    /// starts (None: the index is done). Objects count towards the batch
    /// too, so a run of empty objects cannot hold the lock long.
    fn scrub_batch(&self, start: (u64, u64, u64)) -> (Vec<BlockAt>, Option<(u64, u64, u64)>) {
        let m = lock(&self.meta);
        let (p0, o0, l0) = start;
        let mut out = Vec::with_capacity(SCRUB_BATCH_BLOCKS);
        let mut budget = SCRUB_BATCH_BLOCKS;
        for (&p, part) in m.partitions.range(p0..) {
            for (&o, obj) in part.objects.range(if p == p0 { o0 } else { 0 }..) {
                for (&l, &b) in obj.blocks.range(if (p, o) == (p0, o0) { l0 } else { 0 }..) {
                    if budget == 0 {
                        return (out, Some((p, o, l)));
                    }
                    out.push((p, o, l, b));
                    budget -= 1;
                }
                if budget == 0 {
                    // Logical block numbers stay below 2^48 / BLOCK_SIZE_MIN:
                    // u64::MAX starts after every block of `o`.
                    return (out, Some((p, o, u64::MAX)));
                }
                budget -= 1;
            }
        }
        (out, None)
    }

    /// Checks one block for `scrub`; reports it if it fails its digest and
    /// the object still maps it.
    fn scrub_block(
        &self,
        p: u64,
        o: u64,
        l: u64,
        b: &BlockRef,
        buf: &mut [u8],
        report: &mut ScrubReport,
    ) -> Result<(), StoreError> {
        self.data.read_exact_at(buf, b.phys * self.bs())?;
        report.blocks_checked += 1;
        if ct_eq(&block_digest(buf), &b.digest) {
            return Ok(());
        }
        let _g = self.stripe(p, o).read().expect("object lock poisoned");
        let still_mapped = lock(&self.meta).object(p, o).ok().and_then(|obj| obj.blocks.get(&l).copied()) == Some(*b);
        if still_mapped {
            self.data.read_exact_at(buf, b.phys * self.bs())?;
            if !ct_eq(&block_digest(buf), &b.digest) {
                tracing::error!(
                    partition = p,
                    object = o,
                    block = l,
                    phys = b.phys,
                    "scrub: stored block fails its digest"
                );
                report.corrupt.push(CorruptBlock { partition: p, object: o, block: l });
            }
        }
        Ok(())
    }

    /// Drive-wide figures and the partition list.
    pub fn info(&self) -> StoreInfo {
        let m = lock(&self.meta);
        let bs = self.bs();
        StoreInfo {
            drive_id: self.drive_id,
            block_size: self.block_size,
            capacity_bytes: self.capacity_bytes,
            used_bytes: m.used_blocks() * bs,
            partitions: m
                .partitions
                .iter()
                .map(|(&id, part)| PartitionInfo {
                    partition: id,
                    quota_bytes: part.quota_bytes,
                    used_bytes: part.charged_blocks() * bs,
                    objects: part.objects.len() as u64 + 3,
                })
                .collect(),
        }
    }

    /// The published contents of a control object.
    fn control_bytes(&self, p: u64, o: u64) -> Result<Vec<u8>, StoreError> {
        let now = self.now_ns();
        let m = lock(&self.meta);
        let part = m.partition(p)?;
        Ok(match o {
            DRIVE_CONTROL => DriveControl {
                block_size: self.block_size,
                capacity_bytes: self.capacity_bytes,
                allocated_bytes: m.used_blocks() * self.bs(),
                partitions: m.partitions.len() as u32,
                clock_ns: now,
                clock_skew_ns: self.clock_skew_ns(),
                extensions: self.extensions.clone(),
            }
            .encode(),
            PARTITION_CONTROL => PartitionControl {
                quota_bytes: part.quota_bytes,
                used_bytes: part.charged_blocks() * self.bs(),
                objects_in_use: part.objects.len() as u64 + 3,
                objects_max: OBJECTS_PER_PARTITION_MAX,
            }
            .encode(),
            PARTITION_CONTENTS => {
                let mut out = Vec::with_capacity((part.objects.len() + 3) * 8);
                for id in [DRIVE_CONTROL, PARTITION_CONTROL, PARTITION_CONTENTS]
                    .into_iter()
                    .chain(part.objects.keys().copied())
                {
                    out.extend_from_slice(&id.to_le_bytes());
                }
                out
            }
            _ => unreachable!("not a control object"),
        })
    }

    // ----------------------------------------------------------------- commit

    /// Makes every change so far durable: data first, then one metadata
    /// transaction; then releases blocks the previous durable index held.
    pub fn commit(&self) -> Result<(), StoreError> {
        self.check_healthy()?;
        let _c = lock(&self.commit_lock);
        // Again under the lock: a concurrent commit that failed may have taken
        // the dirty set with it, and an empty batch must not report success.
        self.check_healthy()?;
        let (batch, release) = {
            let mut m = lock(&self.meta);
            let batch = self.snapshot(&mut m);
            m.fresh.clear();
            (batch, std::mem::take(&mut m.pending_free))
        };
        if batch.is_empty() && release.is_empty() {
            // Blocks freed since (aborted writes, reads letting go) go back still.
            self.punch_freed();
            return Ok(());
        }
        if let Err(e) = self.sync_blocks() {
            return Err(self.fail(e));
        }
        if let Err(e) = db::write_batch(&mut lock(&self.db), &batch) {
            tracing::error!(error = %e, "metadata commit failed; refusing further changes");
            self.failed.store(true, Ordering::Release);
            return Err(StoreError::Db(e));
        }
        {
            let mut m = lock(&self.meta);
            for b in release {
                m.free_block(b);
            }
        }
        self.punch_freed();
        Ok(())
    }

    fn snapshot(&self, m: &mut Meta) -> db::Batch {
        let dirty = std::mem::take(&mut m.dirty);
        let mut b = db::Batch::default();
        if dirty.drive {
            let offset = self.clock_offset_ns.load(Ordering::Relaxed);
            b.drive_values.push(("clock_offset_ns", (offset as u64).to_le_bytes().to_vec()));
            b.drive_values.push(("clock_skew_ns", self.clock_skew_ns().to_le_bytes().to_vec()));
        }
        b.removed_partitions = dirty.removed_partitions.into_iter().collect();
        for p in dirty.partitions {
            if let Some(part) = m.partitions.get(&p) {
                b.partitions.push(db::PartitionRow {
                    id: p,
                    quota_bytes: part.quota_bytes,
                    id_high_water: part.high_water,
                });
            }
        }
        b.removed_objects = dirty.removed_objects.into_iter().collect();
        for (p, c) in dirty.collections {
            if let Some(part) = m.partitions.get(&p) {
                b.collections.push((p, c, part.collections.get(&c).map(|(pal, _)| pal.to_bytes())));
            }
        }
        for ((p, o), d) in dirty.objects {
            let Some(obj) = m.partitions.get(&p).and_then(|part| part.objects.get(&o)) else { continue };
            b.objects.push(db::ObjectRow {
                partition: p,
                id: o,
                reserved_blocks: obj.reserved,
                attrs: obj.attrs.clone(),
            });
            if d.replaced {
                b.replaced_objects.push((p, o));
            }
            for l in d.blocks {
                b.blocks.push((p, o, l, obj.blocks.get(&l).copied()));
            }
            if d.txn {
                b.txn_reset.push((p, o));
            }
            if d.pal {
                b.pals.push((p, o, obj.pal.as_ref().map(|pal| pal.to_bytes())));
            }
            if let Some(t) = &obj.txn {
                if d.txn {
                    let row =
                        db::TxnRow { partition: p, object: o, txn: t.id, begun_ns: t.begun_ns, old_size: t.old_size };
                    b.txns.push(row);
                }
                for l in d.undo {
                    b.undo.push((p, o, l, t.undo.get(&l).copied()));
                }
            }
        }
        b
    }
}

/// A block of zeros as large as the largest block: holes are served from it.
static ZEROS: [u8; BLOCK_SIZE_MAX as usize] = [0; BLOCK_SIZE_MAX as usize];

fn serve_bytes(bytes: &[u8], regions: &[Region], sink: &mut dyn DataSink) -> Result<(), StoreError> {
    let len = bytes.len() as u64;
    let lengths: Vec<u64> = regions.iter().map(|r| r.end().min(len).saturating_sub(r.offset)).collect();
    sink.start(&lengths).map_err(StoreError::Sink)?;
    for (r, &n) in regions.iter().zip(&lengths) {
        if n > 0 {
            sink.data(&bytes[r.offset as usize..(r.offset + n) as usize]).map_err(StoreError::Sink)?;
        }
    }
    Ok(())
}
