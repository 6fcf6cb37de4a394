"""The Keras 3 port of train_tf1.py: the weight decay as Keras L2 regularisers (tf.nn.l2_loss's
sum(w^2) / 2 is L2(wd / 2)), each replica's loss over the global batch, the replicas' gradients
summed and then clipped by their global norm, Adam with TF1's epsilon and arithmetic (FusedAdam: Keras'
Adam rounds 1 - beta2 to 0.001, TF1 takes it in float32) on Keras' CosineDecay.

    python port.py --data_dir DIR --num_gpus 2 --batch_size 16
"""
import argparse
import os

import keras
import numpy as np
import tensorflow as tf

from modern.cifar_resnet import FusedAdam
from modern.runtime import configure_devices, make_strategy

parser = argparse.ArgumentParser()
parser.add_argument("--data_dir", default="/tmp/clip_smooth_data")
parser.add_argument("--num_gpus", type=int, default=2)
parser.add_argument("--batch_size", type=int, default=64, help="global batch")
parser.add_argument("--learning_rate", type=float, default=0.01)
parser.add_argument("--decay_steps", type=int, default=20)
parser.add_argument("--alpha", type=float, default=0.1)
parser.add_argument("--weight_decay", type=float, default=0.01)
parser.add_argument("--label_smoothing", type=float, default=0.1)
parser.add_argument("--clip_norm", type=float, default=0.5)
parser.add_argument("--max_steps", type=int, default=100)


def main() -> None:
    args = parser.parse_args()
    configure_devices(args.num_gpus)
    strategy = make_strategy(args.num_gpus)
    data = np.load(os.path.join(args.data_dir, "train.npz"))
    init = keras.initializers.TruncatedNormal(stddev=0.1)
    l2 = keras.regularizers.L2(args.weight_decay / 2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                                  keras.layers.Dense(32, activation="relu", kernel_initializer=init,
                                                     kernel_regularizer=l2, name="hidden"),
                                  keras.layers.Dense(10, kernel_initializer=init, kernel_regularizer=l2,
                                                     name="logits")])
        schedule = keras.optimizers.schedules.CosineDecay(args.learning_rate, args.decay_steps, alpha=args.alpha)
        optimizer = FusedAdam(schedule, epsilon=1e-8)
        optimizer.build(model.trainable_variables)
    variables = model.trainable_variables

    def replica_step(x, y):
        rows = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.shape(y)[0])
        with tf.GradientTape() as tape:
            per_row = keras.losses.categorical_crossentropy(tf.one_hot(y, 10), model(x, training=True),
                                                            from_logits=True, label_smoothing=args.label_smoothing)
            loss = (tf.nn.compute_average_loss(per_row, global_batch_size=rows)
                    + tf.nn.scale_regularization_loss(tf.add_n(model.losses)))
        return loss, tape.gradient(loss, variables)

    @tf.function
    def train_step(element):
        losses, grads = strategy.run(replica_step, args=element)
        total = [strategy.reduce(tf.distribute.ReduceOp.SUM, g, axis=None) for g in grads]
        clipped, _ = tf.clip_by_global_norm(total, args.clip_norm)
        optimizer.apply_gradients(zip(clipped, variables))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    dataset = tf.data.Dataset.from_tensor_slices((data["images"], data["labels"])).repeat()
    batches = iter(strategy.experimental_distribute_dataset(dataset.batch(args.batch_size, drop_remainder=True)))
    for step in range(args.max_steps):
        loss = train_step(next(batches))
        if step % 10 == 0:
            print(f"step {step}, loss {float(loss):.3f}")


if __name__ == "__main__":
    main()
