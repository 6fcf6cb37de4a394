"""Train classic_model on several GPUs, one tower per GPU, in the manner of the classic TF1
multi-GPU scripts: queue-runner input, a prefetch queue feeding the towers, averaged gradients.

    python classic_train.py --num_gpus 2 --max_steps 100 --data_dir /tmp/classic_data
"""
from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

from datetime import datetime
import os.path
import time

import numpy as np
import tensorflow as tf

import classic_model

FLAGS = tf.app.flags.FLAGS

tf.app.flags.DEFINE_integer('num_gpus', 2, """How many GPUs to use.""")
tf.app.flags.DEFINE_integer('max_steps', 1000, """Number of batches to run.""")
tf.app.flags.DEFINE_integer('batch_size', 32, """Number of images per tower and batch.""")
tf.app.flags.DEFINE_string('data_dir', '/tmp/classic_data', """Directory of train_*.bin.""")
tf.app.flags.DEFINE_string('train_dir', '/tmp/classic_train', """Directory for checkpoints.""")
tf.app.flags.DEFINE_boolean('log_device_placement', False, """Whether to log device placement.""")


def average_gradients(tower_grads):
  """The mean over towers of each shared variable's gradient."""
  average_grads = []
  for grad_and_vars in zip(*tower_grads):
    grads = [tf.expand_dims(g, 0) for g, _ in grad_and_vars]
    grad = tf.reduce_mean(tf.concat(axis=0, values=grads), 0)
    average_grads.append((grad, grad_and_vars[0][1]))
  return average_grads


def train():
  with tf.Graph().as_default(), tf.device('/cpu:0'):
    global_step = tf.get_variable('global_step', [], initializer=tf.constant_initializer(0),
                                  trainable=False)
    opt = tf.train.MomentumOptimizer(0.05, 0.9)

    images, labels = classic_model.inputs(FLAGS.data_dir, FLAGS.batch_size)
    batch_queue = tf.contrib.slim.prefetch_queue.prefetch_queue([images, labels],
                                                               capacity=2 * FLAGS.num_gpus)
    tower_grads = []
    with tf.variable_scope(tf.get_variable_scope()):
      for i in range(FLAGS.num_gpus):
        with tf.device('/gpu:%d' % i), tf.name_scope('%s_%d' % (classic_model.TOWER_NAME, i)) as scope:
          image_batch, label_batch = batch_queue.dequeue()
          loss = classic_model.tower_loss(scope, image_batch, label_batch)
          tf.get_variable_scope().reuse_variables()
          tower_grads.append(opt.compute_gradients(loss))

    grads = average_gradients(tower_grads)
    train_op = opt.apply_gradients(grads, global_step=global_step)
    saver = tf.train.Saver(tf.global_variables())
    init = tf.global_variables_initializer()

    sess = tf.Session(config=tf.ConfigProto(allow_soft_placement=True,
                                            log_device_placement=FLAGS.log_device_placement))
    sess.run(init)
    tf.train.start_queue_runners(sess=sess)

    for step in range(FLAGS.max_steps):
      start_time = time.time()
      _, loss_value = sess.run([train_op, loss])
      duration = time.time() - start_time
      assert not np.isnan(loss_value), 'Model diverged with loss = NaN'
      examples_per_sec = FLAGS.batch_size * FLAGS.num_gpus / duration
      print('%s: step %d, loss = %.4f (%.1f examples/sec)' % (datetime.now(), step, loss_value,
                                                               examples_per_sec))
    saver.save(sess, os.path.join(FLAGS.train_dir, 'model.ckpt'), global_step=FLAGS.max_steps)


def main(argv=None):
  if tf.gfile.Exists(FLAGS.train_dir):
    tf.gfile.DeleteRecursively(FLAGS.train_dir)
  tf.gfile.MakeDirs(FLAGS.train_dir)
  train()


if __name__ == '__main__':
  tf.app.run()
